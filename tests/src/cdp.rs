//! Headless Chromium driven over the DevTools protocol through `--remote-debugging-pipe` (file
//! descriptors 3 and 4, NUL-separated JSON): no WebDriver and no WebSocket client needed. One page
//! (target) per browser; calls block the calling thread until Chromium answers.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub struct Chromium {
    child: Child,
    profile: std::path::PathBuf,
    to_browser: File,
    from_browser: BufReader<File>,
    next_id: u64,
    session: String,
}

fn pipe() -> [i32; 2] {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    fds
}

/// Whether an error answered to `Runtime.evaluate` only means the page was between documents.
fn between_documents(error: &Value) -> bool {
    let message = error["message"].as_str().unwrap_or_default();
    [
        "Inspected target navigated or closed",
        "Execution context was destroyed",
        "Cannot find default execution context",
        "Cannot find context with specified id",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// Puts `fd` on `target` for the child to inherit. A `dup2` onto itself keeps `O_CLOEXEC` (in a
/// process with few files open, pipe2 may hand out 3 or 4 itself), so the flag is cleared then.
///
/// # Safety
/// Called between fork and exec: only async-signal-safe calls.
unsafe fn inherit_as(fd: i32, target: i32) -> bool {
    if fd == target {
        libc::fcntl(fd, libc::F_SETFD, 0) == 0
    } else {
        libc::dup2(fd, target) >= 0
    }
}

impl Chromium {
    /// Starts Chromium (window `width`×`height`) with one blank page attached.
    pub fn start(width: u32, height: u32) -> Chromium {
        let profile = std::env::temp_dir().join(format!("fleet-test-cdp-{}", uuid::Uuid::new_v4().simple()));
        let (to, from) = (pipe(), pipe());
        let (child_reads, child_writes) = (to[0], from[1]);
        let mut command = Command::new("chromium");
        command
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
            .args(["--disable-background-networking", "--remote-debugging-pipe", "--hide-scrollbars"])
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe dup2 and fcntl calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if inherit_as(child_reads, 3) && inherit_as(child_writes, 4) {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let child = command.spawn().expect("chromium on PATH (scripts/ensure-chromium.sh installs it)");
        // SAFETY: these fds came from pipe2 above and are owned by nothing else in this process.
        let (to_browser, from_browser) = unsafe {
            libc::close(child_reads);
            libc::close(child_writes);
            (File::from_raw_fd(to[1]), File::from_raw_fd(from[0]))
        };
        let mut browser = Chromium {
            child,
            profile,
            to_browser,
            from_browser: BufReader::new(from_browser),
            next_id: 0,
            session: String::new(),
        };
        let target = browser.call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().expect("a target").to_string();
        let attached = browser.call("Target.attachToTarget", json!({"targetId": target_id, "flatten": true}));
        browser.session = attached["sessionId"].as_str().expect("a session").to_string();
        browser.call("Page.enable", json!({}));
        let metrics = json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        browser.call("Emulation.setDeviceMetricsOverride", metrics);
        browser
    }

    /// Sends one command (to the page once attached) and returns its result; panics on an error.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        match self.try_call(method, params) {
            Ok(result) => result,
            Err(error) => panic!("{method}: {error}"),
        }
    }

    /// Sends one command (to the page once attached): its result, or the error Chromium answered.
    pub fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to_browser.write_all(&bytes).expect("chromium's pipe");
        loop {
            let mut raw = Vec::new();
            let n = self.from_browser.read_until(0, &mut raw).expect("chromium's pipe");
            assert!(n > 0, "chromium closed its pipe");
            raw.pop();
            let answer: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
            if answer["id"] == id {
                return if answer["error"].is_null() {
                    Ok(answer["result"].clone())
                } else {
                    Err(answer["error"].clone())
                };
            }
        }
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value.
    ///
    /// A page between two documents (a navigation, a form's submission or a meta refresh under
    /// way) answers "Inspected target navigated or closed" or has no context for a moment: the
    /// expression is evaluated again in the next document, for up to 10 s.
    pub fn eval(&mut self, expression: &str) -> Value {
        let params = json!({"expression": expression, "returnByValue": true, "awaitPromise": true});
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.try_call("Runtime.evaluate", params.clone()) {
                Ok(r) => return r["result"]["value"].clone(),
                Err(e) if between_documents(&e) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("Runtime.evaluate: {e}"),
            }
        }
    }

    /// Navigates and waits for the page to load.
    pub fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
        self.settle(url);
    }

    /// Waits until a page whose address starts with `prefix` has loaded.
    pub fn settle(&mut self, prefix: &str) {
        let check = format!("document.readyState === 'complete' && location.href.startsWith({prefix:?})");
        self.wait(&check, Duration::from_secs(30));
    }

    /// Waits until `condition` (a JS expression) is true, evaluating it every 50 ms.
    pub fn wait(&mut self, condition: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let guarded = format!("(() => {{ try {{ return !!({condition}); }} catch (e) {{ return false; }} }})()");
        while self.eval(&guarded) != json!(true) {
            assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {condition}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Writes a PNG of the page as shown to `path`.
    pub fn screenshot(&mut self, path: &std::path::Path) {
        use base64::Engine;
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64::engine::general_purpose::STANDARD.decode(shot["data"].as_str().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
