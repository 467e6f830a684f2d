//! Credentials: what the proxy presents upstream (user/password, token, nkey, `.creds`
//! JWT), its own trusted-proxy key, and what it asks of its clients. Secrets never appear
//! in `Debug` output or errors; public keys identify them.

use crate::proto::json::ClientOptions;

/// An nkey seed (`S…`), checked when it is loaded. Never printed: `Debug` shows the
/// public key only.
#[derive(Clone, PartialEq, Eq)]
pub struct NkeySeed(String);

impl NkeySeed {
    /// Checks that `seed` is a valid nkey seed. The error never contains the seed.
    pub fn new(seed: &str) -> Result<NkeySeed, String> {
        let seed = seed.trim();
        nkeys::KeyPair::from_seed(seed)
            .map(|_| NkeySeed(seed.to_owned()))
            .map_err(|e| format!("not a valid nkey seed ({})", e.kind()))
    }

    fn pair(&self) -> nkeys::KeyPair {
        nkeys::KeyPair::from_seed(&self.0).expect("checked in NkeySeed::new")
    }

    /// The public key (`U…` for a user, …).
    pub fn public_key(&self) -> String {
        self.pair().public_key()
    }

    /// The signature of a server nonce, as nats-server checks it: ed25519 over the nonce
    /// string as received, base64url without padding. A key pair made from a seed always
    /// has its private half, so signing cannot fail; were it ever to, the error text is
    /// sent as the signature: the server refuses it (`Authorization Violation`, which the
    /// client then gets) instead of an empty signature passing unnoticed in the logs.
    pub fn sign_nonce(&self, nonce: &str) -> String {
        match self.pair().sign(nonce.as_bytes()) {
            Ok(sig) => data_encoding::BASE64URL_NOPAD.encode(&sig),
            Err(e) => {
                tracing::error!(key = %self.public_key(), error = %e.kind(), "cannot sign the server's nonce");
                format!("natsproxy could not sign the nonce: {}", e.kind())
            }
        }
    }
}

impl std::fmt::Debug for NkeySeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NkeySeed({}, seed ***)", self.public_key())
    }
}

/// Credentials the proxy itself presents upstream (they replace the client's). Nkey and
/// JWT signatures are made per connection over that node's nonce: a client's signature
/// could never be replayed on the next node.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    UserPass {
        user: String,
        pass: String,
    },
    Token(String),
    /// `--nkey-seed`: CONNECT carries `nkey` (the public key) and `sig`.
    Nkey(NkeySeed),
    /// `--creds` (a `.creds` file): CONNECT carries `jwt` and `sig`.
    Jwt {
        jwt: String,
        seed: NkeySeed,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::UserPass { user, .. } => write!(f, "UserPass({user}, ***)"),
            Credentials::Token(_) => write!(f, "Token(***)"),
            Credentials::Nkey(s) => write!(f, "Nkey({})", s.public_key()),
            Credentials::Jwt { seed, .. } => write!(f, "Jwt(user {})", seed.public_key()),
        }
    }
}

/// What natsproxy itself asks of its clients (`--client-token`, `--client-user` and
/// `--client-password`). Without it, clients are not authenticated by the proxy.
#[derive(Clone, PartialEq, Eq)]
pub enum ClientAuth {
    Token(String),
    UserPass { user: String, pass: String },
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientAuth::Token(_) => write!(f, "Token(***)"),
            ClientAuth::UserPass { user, .. } => write!(f, "UserPass({user}, ***)"),
        }
    }
}

/// Equal in time independent of where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl ClientAuth {
    /// True if a client's CONNECT carries these credentials.
    pub fn admits(&self, o: &ClientOptions) -> bool {
        match self {
            ClientAuth::Token(t) => o.auth_token.as_deref().is_some_and(|c| same_secret(c, t)),
            ClientAuth::UserPass { user, pass } => {
                o.user.as_deref() == Some(user.as_str())
                    && o.pass.as_deref().is_some_and(|c| same_secret(c, pass))
            }
        }
    }
}

impl Credentials {
    /// Reads a NATS `.creds` file: the user JWT and the nkey seed between their
    /// `-----BEGIN …-----` / `------END …------` markers.
    pub fn from_creds(text: &str) -> Result<Credentials, String> {
        let block = |what: &str| -> Option<String> {
            let mut lines = text.lines().map(str::trim);
            lines.find(|l| l.starts_with("-----BEGIN") && l.contains(what))?;
            lines
                .take_while(|l| !l.starts_with("------END") && !l.starts_with("-----END"))
                .find(|l| !l.is_empty())
                .map(str::to_owned)
        };
        let jwt = block("JWT").ok_or("no user JWT block (-----BEGIN NATS USER JWT-----)")?;
        let seed = block("SEED").ok_or("no nkey seed block (-----BEGIN USER NKEY SEED-----)")?;
        if jwt.split('.').count() != 3 {
            return Err("the JWT block is not a JWT".into());
        }
        Ok(Credentials::Jwt {
            jwt,
            seed: NkeySeed::new(&seed)?,
        })
    }
}
