//! A `rest_api` source: a query is one GET of a path under its base URL (read-only by
//! construction: no other method is ever sent), with its headers, within the statement timeout,
//! its body read up to `max_bytes`, and its JSON answer read as a table.

use std::time::Duration;

use fleet_protocol::data_sources::{json_table, rest_url, QueryLimits, QueryResult, RestConnection};
use reqwest::header::{HeaderValue, ACCEPT};
use serde_json::Value;
use tokio::time::Instant;

use super::address::{self, PolicyResolver, RefusedHost};
use super::error::{chain, scrub, DataSourceError};
use super::pool::Pool;
use super::SourceTarget;
use crate::tls::ClientTls;

/// A source's HTTP client (its connections pooled by reqwest) and its slots.
pub(crate) struct RestClient {
    client: reqwest::Client,
    slots: Pool<()>,
}

impl RestClient {
    /// The client: no proxy (one would connect around the policy), no redirect (it could carry
    /// the headers elsewhere), the policy on every name it resolves, `tls`'s roots.
    pub(crate) fn new(target: &SourceTarget, tls: &ClientTls) -> Result<Self, DataSourceError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_millis(target.limits.connect_timeout_ms))
            .dns_resolver(PolicyResolver::shared(&target.private))
            .user_agent(concat!("agent-fleet/", env!("CARGO_PKG_VERSION")))
            .use_preconfigured_tls(tls.http_config())
            .build()
            .map_err(|e| DataSourceError::BadTarget(format!("the HTTP client cannot be built: {e}")))?;
        Ok(RestClient { client, slots: Pool::new(target.limits.max_connections) })
    }
}

/// A GET of the base URL: any answer but a server error or a refusal of the credentials will do
/// (many APIs answer 404 at their root).
pub(crate) async fn check(
    client: &RestClient,
    rest: &RestConnection,
    target: &SourceTarget,
) -> Result<(), DataSourceError> {
    let url = rest_url(&rest.base_url, "/", &[]).map_err(|e| DataSourceError::BadTarget(e.to_string()))?;
    let (status, _) = get(client, rest, target, url, &target.limits).await?;
    match status {
        401 | 403 => Err(DataSourceError::AuthFailed(format!("HTTP {status}"))),
        500.. => Err(DataSourceError::BadAnswer(format!("HTTP {status}"))),
        _ => Ok(()),
    }
}

/// `path` (the query's text, e.g. `/users?active=true`) under the base URL, `$n` filled from
/// `parameters`; a 2xx JSON answer as a table.
pub(crate) async fn query(
    client: &RestClient,
    rest: &RestConnection,
    target: &SourceTarget,
    path: &str,
    parameters: &[Value],
    limits: &QueryLimits,
) -> Result<QueryResult, DataSourceError> {
    let started = Instant::now();
    let url =
        rest_url(&rest.base_url, path.trim(), parameters).map_err(|e| DataSourceError::BadParameter(e.to_string()))?;
    let (status, body) = get(client, rest, target, url, limits).await?;
    match status {
        200..=299 => {}
        401 | 403 => return Err(DataSourceError::AuthFailed(format!("HTTP {status}"))),
        _ => return Err(DataSourceError::BadAnswer(format!("HTTP {status}"))),
    }
    let answer: Value = serde_json::from_slice(&body)
        .map_err(|e| DataSourceError::BadAnswer(format!("the answer is not JSON: {e}")))?;
    let table = json_table(answer, usize::try_from(limits.max_rows).unwrap_or(usize::MAX));
    Ok(QueryResult {
        columns: table.columns,
        row_count: table.rows.len() as u64,
        rows: table.rows,
        execution_time_ms: started.elapsed().as_millis() as u64,
        truncated: table.truncated,
    })
}

/// One GET within the statement timeout (the whole exchange, body included), its body read up to
/// `max_bytes`.
async fn get(
    client: &RestClient,
    rest: &RestConnection,
    target: &SourceTarget,
    url: url::Url,
    limits: &QueryLimits,
) -> Result<(u16, Vec<u8>), DataSourceError> {
    address::check_literal(url.host(), &target.private)?;
    let timeout = Duration::from_millis(limits.statement_timeout_ms);
    let _slot = client.slots.lease(timeout).await?;
    let mut request = client.client.get(url).timeout(timeout).header(ACCEPT, "application/json");
    for (name, value) in &rest.headers {
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            DataSourceError::BadTarget(format!("connection.headers: the value of {name} cannot be sent"))
        })?;
        value.set_sensitive(true);
        request = request.header(name.as_str(), value);
    }
    let secrets = target.connection.secrets();
    let failed = |e: reqwest::Error| sent_failure(e, limits, &secrets);
    let mut response = request.send().await.map_err(failed)?;
    let status = response.status().as_u16();
    let too_large = DataSourceError::TooLarge { max_bytes: limits.max_bytes };
    if response.content_length().is_some_and(|len| len > limits.max_bytes) {
        return Err(too_large);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if (body.len() + chunk.len()) as u64 > limits.max_bytes {
            return Err(too_large);
        }
        body.extend_from_slice(&chunk);
    }
    Ok((status, body))
}

/// A request that failed: late, refused by the policy at resolution, not connected, or lost.
fn sent_failure(e: reqwest::Error, limits: &QueryLimits, secrets: &[String]) -> DataSourceError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<RefusedHost>() {
            return DataSourceError::PrivateAddress { host: refused.host.clone() };
        }
        source = cause.source();
    }
    let detail = scrub(&chain(&e), secrets);
    if e.is_timeout() {
        DataSourceError::Timeout { timeout_ms: limits.statement_timeout_ms }
    } else if e.is_connect() {
        DataSourceError::Unreachable(detail)
    } else {
        DataSourceError::ConnectionLost(detail)
    }
}
