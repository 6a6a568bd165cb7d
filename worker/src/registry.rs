//! A short-lived cache of registry entries (tool and webhook targets with their decrypted secrets),
//! so the hot path does not read Redis and decrypt for every attempt. Entries live `ttl` (2 s by
//! default): a registry change reaches every worker within that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A callback target: where to send and the secret to sign with.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    /// `url` parsed once, while the target is cached (`None`: it does not parse, and the request
    /// built from the text fails as it would have).
    parsed: Option<reqwest::Url>,
    pub secret: String,
    /// The scheme and, during a rotation, the previous secret.
    pub signing: crate::signature::SigningKeys,
}

impl Target {
    pub fn new(url: String, secret: String, signing: crate::signature::SigningKeys) -> Self {
        Target { parsed: reqwest::Url::parse(&url).ok(), url, secret, signing }
    }

    /// A POST to the target: a parse of its URL per attempt showed in the worker's profile.
    pub fn post(&self, client: &crate::http::CallbackClient) -> reqwest::RequestBuilder {
        match &self.parsed {
            Some(url) => client.post(url.clone()),
            None => client.post(self.url.as_str()),
        }
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .field("signing", &self.signing)
            .finish()
    }
}

pub struct TargetCache {
    ttl: Duration,
    entries: Mutex<HashMap<String, (Instant, Arc<Target>)>>,
}

impl TargetCache {
    pub fn new(ttl: Duration) -> Self {
        TargetCache { ttl, entries: Mutex::new(HashMap::new()) }
    }

    pub fn get(&self, key: &str) -> Option<Arc<Target>> {
        let entries = self.entries.lock().unwrap();
        entries.get(key).filter(|(at, _)| at.elapsed() < self.ttl).map(|(_, t)| t.clone())
    }

    pub fn put(&self, key: &str, target: Target) -> Arc<Target> {
        let target = Arc::new(target);
        let mut entries = self.entries.lock().unwrap();
        if entries.len() > 10_000 {
            entries.retain(|_, (at, _)| at.elapsed() < self.ttl);
        }
        entries.insert(key.to_string(), (Instant::now(), target.clone()));
        target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire() {
        let cache = TargetCache::new(Duration::from_millis(30));
        cache.put("tool:a", Target::new("http://a".into(), "s".into(), Default::default()));
        assert_eq!(cache.get("tool:a").unwrap().url, "http://a");
        assert!(cache.get("tool:b").is_none());
        std::thread::sleep(Duration::from_millis(40));
        assert!(cache.get("tool:a").is_none());
        assert!(!format!("{:?}", Target::new("u".into(), "hidden".into(), Default::default())).contains("hidden"));
    }
}
