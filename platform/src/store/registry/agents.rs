//! Seed 000's assistants and rooms: a registry each, with the index sets that list them without
//! scanning the keyspace. Assistants and their indexes share the `{assistants}` tag, rooms and
//! theirs the `{rooms}` tag, so each write is one script on one slot. Writes are conditional on the
//! stored text the writer read, so concurrent updates neither lose fields nor break an index.

use crate::store::script::Lua;

use fleet_protocol::agents::{index_member, name_key, AssistantRecord, RoomFilter, RoomRecord, RoomStatus};
use fleet_protocol::keys::RoomIndex;

use super::Registry;
use crate::store::StoreError;

/// KEYS: entry, names, index. ARGV: the entry as read ('' for none), the new entry, id, name, the
/// name as read ('' for none), index member. Answers {1, ''} written, {0, ''} changed meanwhile,
/// {2, holder} the name is another assistant's.
const ASSISTANT_WRITE_LUA: &str = include_str!("lua/assistant_write.lua");

/// KEYS: entry, names, index. ARGV: the entry as read, id, name, index member. 1: deleted, 0: it
/// changed (or went) meanwhile.
const ASSISTANT_DELETE_LUA: &str = include_str!("lua/assistant_delete.lua");

/// KEYS: entry, then index sets. ARGV: the entry as read ('' for none), the new entry, index member,
/// how many of the index sets (the first ones) the member leaves; it joins the rest. 1: written,
/// 0: the entry changed meanwhile.
const ROOM_WRITE_LUA: &str = include_str!("lua/room_write.lua");

static ASSISTANT_WRITE: Lua = Lua::new(|| crate::store::script::load(&[ASSISTANT_WRITE_LUA]));
static ASSISTANT_DELETE: Lua = Lua::new(|| crate::store::script::load(&[ASSISTANT_DELETE_LUA]));
static ROOM_WRITE: Lua = Lua::new(|| crate::store::script::load(&[ROOM_WRITE_LUA]));

/// Index entries a room listing reads at most per request before it answers (a filter the
/// indexes do not cover, namespace and assistant together, may make a page short).
const ROOM_SCAN_BUDGET: usize = 1_000;

/// An assistant as read, with the stored text a conditional write compares against.
#[derive(Debug, Clone)]
pub struct AssistantVersion {
    pub record: AssistantRecord,
    raw: String,
}

/// What a conditional assistant write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssistantWrite {
    Written,
    /// The assistant changed (or was created or deleted) since it was read.
    Changed,
    /// Another assistant (this id) has the name.
    NameTaken(String),
}

/// A room as read, with the stored text a conditional write compares against.
#[derive(Debug, Clone)]
pub struct RoomVersion {
    pub record: RoomRecord,
    raw: String,
}

/// One page of a listing: its entries and, when more may follow, the cursor's order key.
#[derive(Debug, Clone)]
pub struct RegistryPage<T> {
    pub entries: Vec<T>,
    pub next: Option<String>,
}

impl Registry {
    pub async fn read_assistant(&self, id: &str) -> Result<Option<AssistantVersion>, StoreError> {
        let read = self.redis.read_json(self.redis.keys.assistant(id), &format!("assistant {id}")).await?;
        Ok(read.map(|(record, raw)| AssistantVersion { record, raw }))
    }

    pub async fn get_assistant(&self, id: &str) -> Result<Option<AssistantRecord>, StoreError> {
        Ok(self.read_assistant(id).await?.map(|v| v.record))
    }

    /// The assistant named `name` that a caller bound to `tenant` (`None`: unbound) means: the
    /// tenant's own, else the operators' of that name (names are unique per owner).
    pub async fn assistant_by_name(
        &self,
        tenant: Option<&str>,
        name: &str,
    ) -> Result<Option<AssistantRecord>, StoreError> {
        let mut fields = vec![name_key(None, name)];
        if let Some(t) = tenant {
            fields.insert(0, name_key(Some(t), name));
        }
        let r: Result<Vec<Option<String>>, _> = redis::cmd("HMGET")
            .arg(self.redis.keys.assistant_names())
            .arg(&fields)
            .query_async(&mut self.redis.conn().await?)
            .await;
        match self.redis.count(r)?.into_iter().flatten().next() {
            Some(id) => self.get_assistant(&id).await,
            None => Ok(None),
        }
    }

    /// Writes `assistant` if its entry is still what `previous` was read as (`None`: only if
    /// there is none) and its name is no other assistant's.
    pub async fn write_assistant(
        &self,
        assistant: &AssistantRecord,
        previous: Option<&AssistantVersion>,
    ) -> Result<AssistantWrite, StoreError> {
        let json = serde_json::to_string(assistant).expect("an assistant serialises");
        let r: Result<(i64, String), _> = ASSISTANT_WRITE
            .key(self.redis.keys.assistant(&assistant.id))
            .key(self.redis.keys.assistant_names())
            .key(self.redis.keys.assistants_index())
            .arg(previous.map_or("", |p| p.raw.as_str()))
            .arg(json)
            .arg(&assistant.id)
            .arg(name_key(assistant.tenant.as_deref(), &assistant.name))
            .arg(previous.map_or(String::new(), |p| name_key(p.record.tenant.as_deref(), &p.record.name)))
            .arg(index_member(assistant.created_at_ms, &assistant.id))
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(match self.redis.count(r)? {
            (1, _) => AssistantWrite::Written,
            (2, holder) => AssistantWrite::NameTaken(holder),
            _ => AssistantWrite::Changed,
        })
    }

    /// Deletes the assistant as `version` read it; `false` if it changed or went meanwhile.
    pub async fn delete_assistant(&self, version: &AssistantVersion) -> Result<bool, StoreError> {
        let a = &version.record;
        let r: Result<i64, _> = ASSISTANT_DELETE
            .key(self.redis.keys.assistant(&a.id))
            .key(self.redis.keys.assistant_names())
            .key(self.redis.keys.assistants_index())
            .arg(&version.raw)
            .arg(&a.id)
            .arg(name_key(a.tenant.as_deref(), &a.name))
            .arg(index_member(a.created_at_ms, &a.id))
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Assistants newest first, after the order key `after`, at most `limit`.
    pub async fn list_assistants(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<RegistryPage<AssistantRecord>, StoreError> {
        let (members, more) = self.index_page(&self.redis.keys.assistants_index(), after, limit).await?;
        let keys: Vec<String> = members.iter().map(|m| self.redis.keys.assistant(member_id(m))).collect();
        let mut entries = Vec::with_capacity(keys.len());
        for (member, raw) in members.iter().zip(self.read_many(&keys).await?) {
            match raw.map(|raw| serde_json::from_str::<AssistantRecord>(&raw)) {
                Some(Ok(record)) => entries.push(record),
                Some(Err(e)) => return Err(StoreError::Corrupt(format!("assistant {}: {e}", member_id(member)))),
                None => {}
            }
        }
        Ok(RegistryPage { entries, next: more.then(|| members.last().cloned()).flatten() })
    }

    pub async fn read_room(&self, id: &str) -> Result<Option<RoomVersion>, StoreError> {
        let read = self.redis.read_json(self.redis.keys.room(id), &format!("room {id}")).await?;
        Ok(read.map(|(record, raw)| RoomVersion { record, raw }))
    }

    pub async fn get_room(&self, id: &str) -> Result<Option<RoomRecord>, StoreError> {
        Ok(self.read_room(id).await?.map(|v| v.record))
    }

    /// The index sets a room in `status` belongs to: every room, its namespace's, its assistant's,
    /// each whole and by status.
    fn room_indexes(&self, room: &RoomRecord, status: RoomStatus) -> Vec<String> {
        let s = Some(status.as_str());
        let mut sets = vec![
            self.redis.keys.rooms_index(&RoomIndex::All { status: None }),
            self.redis.keys.rooms_index(&RoomIndex::All { status: s }),
            self.redis.keys.rooms_index(&RoomIndex::Assistant { assistant_id: &room.assistant_id, status: None }),
            self.redis.keys.rooms_index(&RoomIndex::Assistant { assistant_id: &room.assistant_id, status: s }),
        ];
        if let Some(namespace) = &room.namespace {
            sets.push(self.redis.keys.rooms_index(&RoomIndex::Namespace { namespace, status: None }));
            sets.push(self.redis.keys.rooms_index(&RoomIndex::Namespace { namespace, status: s }));
        }
        sets
    }

    /// Writes `room` if its entry is still what `previous` was read as (`None`: only if there is
    /// none), moving it between the status indexes when its status changed.
    pub async fn write_room(&self, room: &RoomRecord, previous: Option<&RoomVersion>) -> Result<bool, StoreError> {
        let json = serde_json::to_string(room).expect("a room serialises");
        let joins = self.room_indexes(room, room.status);
        let leaves: Vec<String> = match previous {
            Some(p) if p.record.status != room.status => {
                self.room_indexes(&p.record, p.record.status).into_iter().filter(|k| !joins.contains(k)).collect()
            }
            _ => vec![],
        };
        let mut script = ROOM_WRITE.key(self.redis.keys.room(&room.id));
        for key in leaves.iter().chain(&joins) {
            script.key(key);
        }
        let r: Result<i64, _> = script
            .arg(previous.map_or("", |p| p.raw.as_str()))
            .arg(json)
            .arg(index_member(room.created_at_ms, &room.id))
            .arg(leaves.len())
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Rooms newest first that `filter` admits, after the order key `after`, at most `limit`. The
    /// index read is the narrowest one the filter names; a page may come back short (even empty)
    /// with a cursor when a filter the index does not cover skips many rooms.
    pub async fn list_rooms(
        &self,
        filter: &RoomFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<RegistryPage<RoomRecord>, StoreError> {
        let status = filter.status.map(RoomStatus::as_str);
        let index = match (&filter.namespace, &filter.assistant_id) {
            (Some(namespace), _) => RoomIndex::Namespace { namespace, status },
            (None, Some(assistant_id)) => RoomIndex::Assistant { assistant_id, status },
            (None, None) => RoomIndex::All { status },
        };
        let index = self.redis.keys.rooms_index(&index);
        let mut entries = Vec::with_capacity(limit);
        let mut cursor = after.map(str::to_string);
        let mut scanned = 0;
        loop {
            let chunk = (limit + 1 - entries.len()).max(10);
            let (members, more) = self.index_page(&index, cursor.as_deref(), chunk).await?;
            let keys: Vec<String> = members.iter().map(|m| self.redis.keys.room(member_id(m))).collect();
            for (member, raw) in members.iter().zip(self.read_many(&keys).await?) {
                scanned += 1;
                let Some(raw) = raw else { continue };
                let room: RoomRecord = serde_json::from_str(&raw)
                    .map_err(|e| StoreError::Corrupt(format!("room {}: {e}", member_id(member))))?;
                if filter.matches(&room) {
                    if entries.len() == limit {
                        // One more exists: the page ends with the entry before it.
                        let last = entries.last().map(|r: &RoomRecord| index_member(r.created_at_ms, &r.id));
                        return Ok(RegistryPage { entries, next: last });
                    }
                    entries.push(room);
                }
                cursor = Some(member.clone());
            }
            if !more {
                return Ok(RegistryPage { entries, next: None });
            }
            if scanned >= ROOM_SCAN_BUDGET {
                return Ok(RegistryPage { entries, next: cursor });
            }
        }
    }

    /// Up to `limit` ids of the assistant's active rooms.
    pub async fn active_rooms_of(&self, assistant_id: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let index = self
            .redis
            .keys
            .rooms_index(&RoomIndex::Assistant { assistant_id, status: Some(RoomStatus::Active.as_str()) });
        let (members, _) = self.index_page(&index, None, limit).await?;
        Ok(members.iter().map(|m| member_id(m).to_string()).collect())
    }

    /// Up to `limit` members of an index set newest first, after `after`, and whether more follow.
    async fn index_page(
        &self,
        index: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let max = after.map(|a| format!("({a}")).unwrap_or_else(|| "+".into());
        let r: Result<Vec<String>, _> = redis::cmd("ZREVRANGEBYLEX")
            .arg(index)
            .arg(max)
            .arg("-")
            .arg("LIMIT")
            .arg(0)
            .arg(limit + 1)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let mut members = self.redis.count(r)?;
        let more = members.len() > limit;
        members.truncate(limit);
        Ok((members, more))
    }

    /// The values of `keys` (one slot), in order.
    async fn read_many(&self, keys: &[String]) -> Result<Vec<Option<String>>, StoreError> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let r: Result<Vec<Option<String>>, _> =
            redis::cmd("MGET").arg(keys).query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }
}

/// The id in an index member (`agents::index_member`).
fn member_id(member: &str) -> &str {
    member.split_once(':').map_or(member, |(_, id)| id)
}
