//! The artifact store: seed 001's uploaded files, behind the `object_store` crate. Where they
//! live is `FLEET_ARTIFACTS_URL`: `file:///var/lib/fleet/artifacts` (a directory, made as files
//! arrive) or `s3://bucket/prefix` (credentials and region from the usual `AWS_*` settings). A
//! file's key is `<prefix>/<session>/<artifact id>`, so a session's files are deleted by listing
//! one prefix, even a file whose record was never written. An S3 client speaks through the
//! fleet's own HTTP client: `ClientTls`'s roots, no proxy, no redirect.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, PutPayload};

use crate::source::{ConfigError, Source};
use crate::tls::ClientTls;

/// The `AWS_*` settings an `s3://` store reads (as the AWS SDKs name them).
const AWS_SETTINGS: [&str; 9] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
];

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("the artifact store failed: {0}")]
    Store(#[from] object_store::Error),
}

/// Where a session's files are kept: the store and the prefix every key starts with.
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
}

/// The fleet's HTTP client, lent to an S3 store in place of the one it would build itself.
#[derive(Debug)]
struct FleetClient(reqwest::Client);

impl object_store::client::HttpConnector for FleetClient {
    fn connect(&self, _: &object_store::ClientOptions) -> object_store::Result<object_store::client::HttpClient> {
        Ok(object_store::client::HttpClient::new(self.0.clone()))
    }
}

impl ArtifactStore {
    /// The store `FLEET_ARTIFACTS_URL` names (nothing is connected or made yet).
    pub fn open(url: &str, src: &Source, tls: &ClientTls) -> Result<Self, ConfigError> {
        const SETTING: &str = "FLEET_ARTIFACTS_URL";
        let bad = |problem: String| ConfigError::new(SETTING, problem);
        let parsed = url::Url::parse(url).map_err(|e| bad(format!("is not a URL: {e}")))?;
        let root = Path::parse(parsed.path()).map_err(|e| bad(format!("has a path no store can use: {e}")))?;
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            "file" if parsed.host_str().is_none_or(str::is_empty) => {
                Arc::new(object_store::local::LocalFileSystem::new().with_automatic_cleanup(true))
            }
            "s3" if parsed.host_str().is_some() => {
                let client = reqwest::Client::builder()
                    .use_preconfigured_tls(tls.http_config())
                    .no_proxy()
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| bad(format!("no HTTP client for it: {e}")))?;
                let mut builder = object_store::aws::AmazonS3Builder::new().with_url(url);
                for name in AWS_SETTINGS {
                    if let (Some(value), Ok(key)) = (src.get(name), name.to_ascii_lowercase().parse()) {
                        builder = builder.with_config(key, value);
                    }
                }
                Arc::new(builder.with_http_connector(FleetClient(client)).build().map_err(|e| bad(e.to_string()))?)
            }
            _ => return Err(bad(format!("must be file:///<directory> or s3://<bucket>/<prefix>, not {url:?}"))),
        };
        Ok(ArtifactStore { store, root })
    }

    fn session_prefix(&self, session_id: &str) -> Path {
        self.root.child(PathPart::from(session_id))
    }

    fn key(&self, session_id: &str, artifact_id: &str) -> Path {
        self.session_prefix(session_id).child(PathPart::from(artifact_id))
    }

    pub async fn put(&self, session_id: &str, artifact_id: &str, bytes: Bytes) -> Result<(), ArtifactError> {
        self.store.put(&self.key(session_id, artifact_id), PutPayload::from_bytes(bytes)).await?;
        Ok(())
    }

    /// The file's bytes; `None` if the store has no such file.
    pub async fn get(&self, session_id: &str, artifact_id: &str) -> Result<Option<Bytes>, ArtifactError> {
        match self.store.get(&self.key(session_id, artifact_id)).await {
            Ok(found) => Ok(Some(found.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes one file (taking back an upload that was not recorded); a missing one is no error.
    pub async fn delete(&self, session_id: &str, artifact_id: &str) -> Result<(), ArtifactError> {
        match self.store.delete(&self.key(session_id, artifact_id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes every file of the session; how many it deleted.
    pub async fn delete_session(&self, session_id: &str) -> Result<usize, ArtifactError> {
        let prefix = self.session_prefix(session_id);
        let listed: Vec<Path> = match self.store.list(Some(&prefix)).map_ok(|meta| meta.location).try_collect().await {
            Ok(listed) => listed,
            // A directory never made lists as not found.
            Err(object_store::Error::NotFound { .. }) => vec![],
            Err(e) => return Err(e.into()),
        };
        for location in &listed {
            match self.store.delete(location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(listed.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(url: &str) -> Result<ArtifactStore, ConfigError> {
        let src = Source::from_pairs([]);
        ArtifactStore::open(url, &src, &ClientTls::load(&src).unwrap())
    }

    #[test]
    fn only_a_directory_or_a_bucket_is_a_store() {
        assert!(open("file:///var/lib/fleet/artifacts").is_ok());
        assert!(open("s3://bucket/prefix").is_ok());
        for bad in ["/var/lib/fleet", "http://example.com/x", "file://host/x", "gs://b/p"] {
            assert_eq!(open(bad).unwrap_err().setting, "FLEET_ARTIFACTS_URL", "{bad}");
        }
    }

    #[test]
    fn a_sessions_key_cannot_leave_its_prefix() {
        let store = open("file:///tmp/fleet-artifacts").unwrap();
        let key = store.key("acme:../../etc", "art_1");
        assert_eq!(key.parts().count(), 4, "{key}");
        assert!(key.as_ref().starts_with("tmp/fleet-artifacts/"), "{key}");
    }

    #[tokio::test]
    async fn files_are_put_read_and_deleted_by_session() {
        let dir = std::env::temp_dir().join(format!("fleet-artifacts-{}", std::process::id()));
        let store = open(&format!("file://{}", dir.display())).unwrap();
        store.put("s1", "art_a", Bytes::from_static(b"one")).await.unwrap();
        store.put("s1", "art_b", Bytes::from_static(b"two")).await.unwrap();
        store.put("s2", "art_c", Bytes::from_static(b"three")).await.unwrap();
        assert_eq!(store.get("s1", "art_a").await.unwrap().as_deref(), Some(&b"one"[..]));
        assert_eq!(store.delete_session("s1").await.unwrap(), 2);
        assert_eq!(store.get("s1", "art_a").await.unwrap(), None);
        assert_eq!(store.delete_session("never").await.unwrap(), 0);
        assert_eq!(store.get("s2", "art_c").await.unwrap().as_deref(), Some(&b"three"[..]));
        store.delete("s2", "art_c").await.unwrap();
        store.delete("s2", "art_c").await.unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
