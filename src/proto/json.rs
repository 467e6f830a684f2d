//! CONNECT and INFO payloads. Only the fields the proxy acts on are typed; the INFO it
//! writes for clients is derived from the upstream's by removing what must not reach them.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The options of a client's CONNECT, with nats-server's defaults for absent fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientOptions {
    pub verbose: bool,
    pub pedantic: bool,
    pub echo: bool,
    pub headers: bool,
    pub no_responders: bool,
    pub protocol: i64,
    pub name: Option<String>,
    pub lang: Option<String>,
    pub version: Option<String>,
    pub user: Option<String>,
    pub pass: Option<String>,
    pub auth_token: Option<String>,
}

impl Default for ClientOptions {
    /// What nats-server assumes before (or without) a CONNECT: verbose, pedantic and echo on.
    fn default() -> Self {
        ClientOptions {
            verbose: true,
            pedantic: true,
            echo: true,
            headers: false,
            no_responders: false,
            protocol: 0,
            name: None,
            lang: None,
            version: None,
            user: None,
            pass: None,
            auth_token: None,
        }
    }
}

#[derive(Deserialize)]
struct RawConnect {
    verbose: Option<bool>,
    pedantic: Option<bool>,
    echo: Option<bool>,
    headers: Option<bool>,
    no_responders: Option<bool>,
    protocol: Option<i64>,
    name: Option<String>,
    lang: Option<String>,
    version: Option<String>,
    user: Option<String>,
    pass: Option<String>,
    auth_token: Option<String>,
    account: Option<String>,
    new_account: Option<bool>,
}

/// Why a CONNECT is refused, with nats-server's reaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectRejection {
    /// Unparsable JSON: silent close.
    BadJson,
    /// `protocol` outside 0..=1.
    BadProtocol,
    /// `no_responders` without `headers`.
    NoRespondersNeedsHeaders,
    /// `account` / `new_account` present.
    Authorization,
}

impl ConnectRejection {
    /// The `-ERR` line sent before closing, if any.
    pub fn err_text(self) -> Option<&'static str> {
        match self {
            ConnectRejection::BadJson => None,
            ConnectRejection::BadProtocol => Some("invalid client protocol"),
            ConnectRejection::NoRespondersNeedsHeaders => {
                Some("no responders requires headers support")
            }
            ConnectRejection::Authorization => Some("Authorization Violation"),
        }
    }
}

impl ClientOptions {
    /// Applies a CONNECT to the current options: present fields overwrite, absent and
    /// `null` fields keep their value (as Go's `json.Unmarshal` into existing options does).
    pub fn apply_connect(&self, json: &[u8]) -> Result<ClientOptions, ConnectRejection> {
        let raw: RawConnect =
            serde_json::from_slice(json).map_err(|_| ConnectRejection::BadJson)?;
        let mut o = self.clone();
        o.verbose = raw.verbose.unwrap_or(o.verbose);
        o.pedantic = raw.pedantic.unwrap_or(o.pedantic);
        o.echo = raw.echo.unwrap_or(o.echo);
        o.headers = raw.headers.unwrap_or(o.headers);
        o.no_responders = raw.no_responders.unwrap_or(o.no_responders);
        o.protocol = raw.protocol.unwrap_or(o.protocol);
        o.name = raw.name.or(o.name);
        o.lang = raw.lang.or(o.lang);
        o.version = raw.version.or(o.version);
        o.user = raw.user.or(o.user);
        o.pass = raw.pass.or(o.pass);
        o.auth_token = raw.auth_token.or(o.auth_token);
        if !(0..=1).contains(&o.protocol) {
            return Err(ConnectRejection::BadProtocol);
        }
        if o.no_responders && !o.headers {
            return Err(ConnectRejection::NoRespondersNeedsHeaders);
        }
        if raw.account.is_some_and(|a| !a.is_empty()) || raw.new_account == Some(true) {
            return Err(ConnectRejection::Authorization);
        }
        Ok(o)
    }

    /// The CONNECT the proxy sends upstream on the client's behalf, at most `max_len`
    /// bytes (the upstream's control-line limit counts the JSON only).
    ///
    /// Only what differs from nats-server's defaults is written, so that it is no longer
    /// than the client's own CONNECT by more than 81 bytes (`CONNECT_OVERHEAD`, asserted by the handshake tests):
    /// `verbose:false,pedantic:false` (the defaults are true), `protocol:1` so that async
    /// INFOs (lame duck) arrive, `headers` and `no_responders` on (JetStream statuses),
    /// `echo:false` only when the client said so; the client's `name`, `lang`, `version`
    /// and pass-through credentials as it sent them. When that is still too long, the
    /// informational fields give way (`version`, `lang`, then `name` is cut short); what
    /// authenticates never does: then the CONNECT does not fit at all.
    ///
    /// `auth` is what authenticates it, chosen and signed over the node's nonce by
    /// [`crate::auth`] (the codec never sees a secret key).
    pub fn upstream_connect_json(
        &self,
        auth: &ConnectAuth,
        max_len: usize,
    ) -> Result<Vec<u8>, ConnectTooLong> {
        let mut m = Map::new();
        m.insert("verbose".into(), false.into());
        m.insert("pedantic".into(), false.into());
        m.insert("protocol".into(), 1.into());
        if !self.echo {
            m.insert("echo".into(), false.into());
        }
        m.insert("headers".into(), true.into());
        m.insert("no_responders".into(), true.into());
        let fields = [
            ("user", &auth.user),
            ("pass", &auth.pass),
            ("auth_token", &auth.auth_token),
            ("nkey", &auth.nkey),
            ("jwt", &auth.jwt),
            ("sig", &auth.sig),
            ("proxy_sig", &auth.proxy_sig),
        ];
        for (k, v) in fields {
            if let Some(v) = v {
                m.insert(k.into(), v.clone().into());
            }
        }
        let identity = [
            ("version", &self.version),
            ("lang", &self.lang),
            ("name", &self.name),
        ];
        for (k, v) in identity {
            if let Some(v) = v {
                m.insert(k.into(), v.clone().into());
            }
        }
        fit_connect(m, max_len)
    }
}

/// The fields of a CONNECT that authenticate it, as they go on the wire.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnectAuth {
    pub user: Option<String>,
    pub pass: Option<String>,
    pub auth_token: Option<String>,
    /// The public nkey (`U…`).
    pub nkey: Option<String>,
    pub jwt: Option<String>,
    /// The signature of the server's nonce by the nkey (or the JWT's key).
    pub sig: Option<String>,
    /// The proxy's own signature of the nonce (trusted proxies).
    pub proxy_sig: Option<String>,
}

impl std::fmt::Debug for ConnectAuth {
    /// Which fields are set, never their values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("ConnectAuth")
            .field("user", &set(&self.user))
            .field("pass", &set(&self.pass))
            .field("auth_token", &set(&self.auth_token))
            .field("nkey", &self.nkey)
            .field("jwt", &set(&self.jwt))
            .field("sig", &set(&self.sig))
            .field("proxy_sig", &set(&self.proxy_sig))
            .finish()
    }
}

/// The most the proxy's CONNECT adds to the client's when the client sent only what the
/// proxy cannot copy: `{"verbose":false,"pedantic":false,"protocol":1,"headers":true,
/// "no_responders":true}` against the client's `{}` (the client's own `echo`, identity and
/// credentials are copied at their length). Past the limit, [`fit_connect`] shortens the
/// identity fields by up to this much.
#[cfg(test)]
pub(crate) const CONNECT_OVERHEAD: usize = 81;

/// The proxy's CONNECT cannot be made to fit the upstream's control line: the client gets
/// nats-server's own `-ERR 'maximum control line exceeded'`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectTooLong {
    /// Bytes of the shortest CONNECT the proxy could write.
    pub len: usize,
}

/// Serializes `m`, dropping `version` and `lang`, then cutting `name` short, while it is
/// longer than `max_len`.
fn fit_connect(mut m: Map<String, Value>, max_len: usize) -> Result<Vec<u8>, ConnectTooLong> {
    let to_vec = |m: &Map<String, Value>| serde_json::to_vec(m).unwrap_or_default();
    let mut out = to_vec(&m);
    for k in ["version", "lang"] {
        if out.len() <= max_len {
            return Ok(out);
        }
        if m.remove(k).is_some() {
            out = to_vec(&m);
        }
    }
    if out.len() <= max_len {
        return Ok(out);
    }
    let Some(Value::String(name)) = m.remove("name") else {
        return Err(ConnectTooLong { len: out.len() });
    };
    let bare = to_vec(&m).len();
    // `,"name":""` (or without the comma when it is the only field) plus the cut name,
    // each character at its escaped length.
    let room = max_len.saturating_sub(bare + r#","name":"""#.len());
    let mut used = 0;
    let cut: String = name
        .chars()
        .take_while(|c| {
            let mut b = [0u8; 4];
            let esc = serde_json::to_string(c.encode_utf8(&mut b)).map_or(6, |s| s.len() - 2);
            used += esc;
            used <= room
        })
        .collect();
    if !cut.is_empty() {
        m.insert("name".into(), cut.into());
    }
    let out = to_vec(&m);
    if out.len() <= max_len {
        Ok(out)
    } else {
        Err(ConnectTooLong { len: out.len() })
    }
}

/// The fields of a server INFO the proxy acts on, plus the whole object.
#[derive(Debug, Clone, Default)]
pub struct ServerInfo {
    pub max_payload: Option<usize>,
    pub ldm: bool,
    pub connect_urls: Vec<String>,
    pub auth_required: bool,
    pub tls_required: bool,
    pub server_name: String,
    pub server_id: String,
    pub nonce: Option<String>,
    /// The whole INFO object.
    pub raw: Map<String, Value>,
}

impl ServerInfo {
    /// Parses an INFO's JSON. `None` for anything that is not a JSON object.
    pub fn parse(json: &[u8]) -> Option<ServerInfo> {
        let Value::Object(raw) = serde_json::from_slice(json).ok()? else {
            return None;
        };
        let s = |k: &str| raw.get(k).and_then(Value::as_str).map(str::to_owned);
        let b = |k: &str| raw.get(k).and_then(Value::as_bool).unwrap_or(false);
        Some(ServerInfo {
            max_payload: raw
                .get("max_payload")
                .and_then(Value::as_u64)
                .map(|v| v as usize),
            ldm: b("ldm"),
            connect_urls: raw
                .get("connect_urls")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|u| u.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            auth_required: b("auth_required"),
            tls_required: b("tls_required"),
            server_name: s("server_name").unwrap_or_default(),
            server_id: s("server_id").unwrap_or_default(),
            nonce: s("nonce"),
            raw,
        })
    }

    /// The INFO the proxy gives its client: the upstream's minus everything that would
    /// make the client bypass the proxy (`connect_urls`), react to the cluster
    /// (`ldm`), or negotiate TLS/nonces with the proxy. `headers:true`, `proto:1`.
    pub fn client_info_json(&self, max_payload: usize, auth_required: bool) -> Vec<u8> {
        let mut m = self.raw.clone();
        for k in [
            "connect_urls",
            "ws_connect_urls",
            "ldm",
            "nonce",
            "auth_required",
            "tls_required",
            "tls_verify",
            "tls_available",
            "connect_info",
            "remote_account",
            "acc_is_sys",
            "xkey",
        ] {
            m.remove(k);
        }
        m.insert("headers".into(), true.into());
        m.insert("proto".into(), 1.into());
        m.insert("max_payload".into(), max_payload.into());
        m.insert("tls_required".into(), false.into());
        if auth_required {
            m.insert("auth_required".into(), true.into());
        }
        serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
    }

    /// True for the INFO nats-server (2.12+) sends a `protocol:1` client right after the
    /// PONG to its first PING: `connect_info:true` and the account it was bound to.
    pub fn is_connect_info(&self) -> bool {
        self.raw.get("connect_info") == Some(&Value::Bool(true))
    }

    /// That INFO for the proxy's client: [`client_info_json`](Self::client_info_json)
    /// plus `connect_info`, `remote_account` and `acc_is_sys` as the upstream gave them
    /// (the client is bound to the account the proxy's CONNECT was).
    pub fn client_connect_info_json(&self, max_payload: usize, auth_required: bool) -> Vec<u8> {
        let base = self.client_info_json(max_payload, auth_required);
        let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(&base) else {
            return base;
        };
        for k in ["connect_info", "remote_account", "acc_is_sys"] {
            if let Some(v) = self.raw.get(k) {
                m.insert(k.into(), v.clone());
            }
        }
        serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_defaults_are_kept_for_absent_and_null_fields() {
        let o = ClientOptions::default().apply_connect(b"{}").unwrap();
        assert!(o.verbose && o.pedantic && o.echo);
        let o = ClientOptions::default()
            .apply_connect(br#"{"verbose":false,"pedantic":null,"headers":true,"no_responders":true,"jwt":null}"#)
            .unwrap();
        assert!(!o.verbose && o.pedantic && o.headers && o.no_responders);
    }

    #[test]
    fn connect_rejections() {
        let d = ClientOptions::default();
        assert_eq!(d.apply_connect(b"{"), Err(ConnectRejection::BadJson));
        assert_eq!(
            d.apply_connect(br#"{"protocol":2}"#),
            Err(ConnectRejection::BadProtocol)
        );
        assert_eq!(
            d.apply_connect(br#"{"no_responders":true}"#),
            Err(ConnectRejection::NoRespondersNeedsHeaders)
        );
        assert_eq!(
            d.apply_connect(br#"{"account":"A"}"#),
            Err(ConnectRejection::Authorization)
        );
    }

    #[test]
    fn client_info_strips_cluster_fields() {
        let i = ServerInfo::parse(br#"{"server_id":"X","max_payload":2048,"connect_urls":["a:1"],"ldm":true,"nonce":"n","tls_required":true,"port":4222}"#).unwrap();
        assert!(i.ldm);
        assert_eq!(i.connect_urls, vec!["a:1".to_string()]);
        let out: Value = serde_json::from_slice(&i.client_info_json(2048, false)).unwrap();
        assert!(out.get("connect_urls").is_none());
        assert!(out.get("ldm").is_none());
        assert!(out.get("nonce").is_none());
        assert_eq!(out["tls_required"], false);
        assert_eq!(out["headers"], true);
        assert_eq!(out["proto"], 1);
        assert_eq!(out["max_payload"], 2048);
        assert_eq!(out["port"], 4222);
    }
}
