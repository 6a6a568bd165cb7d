//! A console client for the tests: a login's session cookie, and the pages and forms sent with it.

/// A logged-in console session (or, built by hand, a forged or empty cookie).
pub struct ConsoleClient {
    pub http: reqwest::Client,
    pub api: String,
    pub cookie: String,
}

/// What a login answered: its status, `Set-Cookie` and page, and the session after a 303.
pub struct Login {
    pub status: u16,
    pub set_cookie: String,
    pub page: String,
    pub client: Option<ConsoleClient>,
}

impl ConsoleClient {
    /// Logs in with `token` through the login form (`tls`: as behind a TLS proxy).
    pub async fn login(api: &str, token: &str, tls: bool) -> Login {
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let r = crate::console_login(&http, api, token, tls).await;
        let status = r.status().as_u16();
        let set_cookie = r.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let page = r.text().await.unwrap_or_default();
        let cookie = set_cookie.split(';').next().unwrap_or_default().to_string();
        let client = (status == 303).then(|| ConsoleClient { http, api: api.to_string(), cookie });
        Login { status, set_cookie, page, client }
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = self.http.get(format!("{}{path}", self.api)).header("cookie", &self.cookie).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> (u16, String) {
        let url = format!("{}{path}", self.api);
        let r = self.http.post(url).header("cookie", &self.cookie).form(form).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// The session's CSRF token, from a page's forms.
    pub async fn csrf(&self) -> String {
        let (_, page) = self.get("/console/audit").await;
        page.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string()
    }
}
