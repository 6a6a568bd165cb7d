//! Another process's view of a TCP connection: the socket option it set on its end, read through
//! a duplicate of its descriptor (`pidfd_getfd`, Linux 5.6+; a test may read its own children's).

use std::io;

/// Whether the socket process `pid` holds for the connection between its `local_port` and this
/// process's `peer_port` (on 127.0.0.1) has `TCP_NODELAY` set.
pub fn nodelay_of(pid: u32, local_port: u16, peer_port: u16) -> io::Result<bool> {
    let inode = socket_inode(pid, local_port, peer_port)?;
    nodelay_of_socket(pid, descriptor_of(pid, inode)?)
}

/// `TCP_NODELAY` of each connection process `pid` holds to `remote_port` (whatever its own port).
pub fn nodelay_to(pid: u32, remote_port: u16) -> io::Result<Vec<bool>> {
    let inodes: Vec<u64> =
        connections(pid)?.into_iter().filter(|c| c.established && c.remote == remote_port).map(|c| c.inode).collect();
    let held = inodes.into_iter().filter_map(|inode| descriptor_of(pid, inode).ok());
    held.map(|fd| nodelay_of_socket(pid, fd)).collect()
}

/// One TCP connection of `/proc/<pid>/net/tcp{,6}`.
struct Connection {
    local: u16,
    remote: u16,
    established: bool,
    inode: u64,
}

/// The TCP connections (IPv4 and IPv6) in `pid`'s network namespace.
fn connections(pid: u32) -> io::Result<Vec<Connection>> {
    let port = |addr: &str| addr.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    let mut found = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))?;
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(inode)) =
                (fields.get(1).and_then(|a| port(a)), fields.get(2).and_then(|a| port(a)), fields.get(9))
            else {
                continue;
            };
            let inode = inode.parse().map_err(|_| io::Error::other(format!("no inode in {line:?}")))?;
            // State 01: established.
            found.push(Connection { local, remote, established: fields[3] == "01", inode });
        }
    }
    Ok(found)
}

/// `TCP_NODELAY` of the socket `pid` holds as descriptor `fd`.
fn nodelay_of_socket(pid: u32, fd: libc::c_int) -> io::Result<bool> {
    // SAFETY: plain syscalls on descriptors this function opens and closes itself.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as libc::c_int;
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let copy = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) as libc::c_int;
        let copy_error = io::Error::last_os_error();
        libc::close(pidfd);
        if copy < 0 {
            return Err(copy_error);
        }
        let (mut value, mut len) = (0 as libc::c_int, std::mem::size_of::<libc::c_int>() as libc::socklen_t);
        let r = libc::getsockopt(
            copy,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        );
        let error = io::Error::last_os_error();
        libc::close(copy);
        if r < 0 {
            return Err(error);
        }
        Ok(value != 0)
    }
}

/// The inode of the connection `local_port` ↔ `peer_port` in `pid`'s network namespace.
fn socket_inode(pid: u32, local_port: u16, peer_port: u16) -> io::Result<u64> {
    let found = connections(pid)?.into_iter().find(|c| c.local == local_port && c.remote == peer_port);
    found
        .map(|c| c.inode)
        .ok_or_else(|| io::Error::other(format!("no connection {local_port} ↔ {peer_port} in process {pid}")))
}

/// The descriptor number under which `pid` holds socket `inode`.
fn descriptor_of(pid: u32, inode: u64) -> io::Result<libc::c_int> {
    let wanted = format!("socket:[{inode}]");
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.as_os_str() == wanted.as_str()) {
            return entry.file_name().to_string_lossy().parse().map_err(|_| io::Error::other("a descriptor name"));
        }
    }
    Err(io::Error::other(format!("process {pid} holds no {wanted}")))
}
