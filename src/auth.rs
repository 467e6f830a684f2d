//! Credentials: what the proxy presents upstream (user/password, token, nkey, `.creds`
//! JWT), its own trusted-proxy key, and what it asks of its clients. Secrets never appear
//! in `Debug` output or errors; public keys identify them.

use crate::proto::json::{ClientOptions, ConnectAuth};

/// An nkey seed (`S…`), checked when it is loaded. Never printed: `Debug` shows the
/// public key only.
#[derive(Clone, PartialEq, Eq)]
pub struct NkeySeed(String);

impl NkeySeed {
    /// Checks that `seed` is a valid nkey seed. The error never contains the seed.
    pub fn new(seed: &str) -> Result<NkeySeed, SeedError> {
        let seed = seed.trim();
        nkeys::KeyPair::from_seed(seed)
            .map(|_| NkeySeed(seed.to_owned()))
            .map_err(|e| SeedError(e.kind()))
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

/// A string that is not an nkey seed; carries only what nkeys says is wrong with it.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("not a valid nkey seed ({0})")]
pub struct SeedError(pub nkeys::error::ErrorKind);

/// Why a `.creds` file does not give credentials; never carries its content.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum CredsError {
    #[error("no user JWT block (-----BEGIN NATS USER JWT-----)")]
    NoJwt,
    #[error("no nkey seed block (-----BEGIN USER NKEY SEED-----)")]
    NoSeed,
    #[error("the JWT block is not a JWT")]
    NotAJwt,
    #[error(transparent)]
    Seed(#[from] SeedError),
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
    pub fn from_creds(text: &str) -> Result<Credentials, CredsError> {
        let block = |what: &str| -> Option<String> {
            let mut lines = text.lines().map(str::trim);
            lines.find(|l| l.starts_with("-----BEGIN") && l.contains(what))?;
            lines
                .take_while(|l| !l.starts_with("------END") && !l.starts_with("-----END"))
                .find(|l| !l.is_empty())
                .map(str::to_owned)
        };
        let jwt = block("JWT").ok_or(CredsError::NoJwt)?;
        let seed = block("SEED").ok_or(CredsError::NoSeed)?;
        if jwt.split('.').count() != 3 {
            return Err(CredsError::NotAJwt);
        }
        Ok(Credentials::Jwt {
            jwt,
            seed: NkeySeed::new(&seed)?,
        })
    }
}

/// What authenticates the proxy's CONNECT to a node whose INFO carried `nonce`: the
/// credentials the proxy holds (nkey and JWT ones sign that nonce), else the client's
/// user, password or token as it sent them; and the proxy's own signature
/// (`proxy_sig`, for servers that list natsproxy as a trusted proxy) when it has a key.
pub fn connect_auth(
    held: Option<&Credentials>,
    client: &ClientOptions,
    nonce: Option<&str>,
    proxy_key: Option<&NkeySeed>,
) -> ConnectAuth {
    let nonce = nonce.unwrap_or("");
    let mut a = match held {
        Some(Credentials::UserPass { user, pass }) => ConnectAuth {
            user: Some(user.clone()),
            pass: Some(pass.clone()),
            ..ConnectAuth::default()
        },
        Some(Credentials::Token(t)) => ConnectAuth {
            auth_token: Some(t.clone()),
            ..ConnectAuth::default()
        },
        Some(Credentials::Nkey(seed)) => ConnectAuth {
            nkey: Some(seed.public_key()),
            sig: Some(seed.sign_nonce(nonce)),
            ..ConnectAuth::default()
        },
        Some(Credentials::Jwt { jwt, seed }) => ConnectAuth {
            jwt: Some(jwt.clone()),
            sig: Some(seed.sign_nonce(nonce)),
            ..ConnectAuth::default()
        },
        None => ConnectAuth {
            user: client.user.clone(),
            pass: client.pass.clone(),
            auth_token: client.auth_token.clone(),
            ..ConnectAuth::default()
        },
    };
    a.proxy_sig = proxy_key.map(|k| k.sign_nonce(nonce));
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn verify(public: &str, nonce: &str, sig: &str) -> bool {
        let sig = data_encoding::BASE64URL_NOPAD
            .decode(sig.as_bytes())
            .unwrap();
        nkeys::KeyPair::from_public_key(public)
            .unwrap()
            .verify(nonce.as_bytes(), &sig)
            .is_ok()
    }

    #[test]
    fn held_nkey_jwt_and_proxy_key_sign_the_nodes_nonce() {
        let user = nkeys::KeyPair::new_user();
        let proxy = nkeys::KeyPair::new_user();
        let seed = NkeySeed::new(&user.seed().unwrap()).unwrap();
        let pkey = NkeySeed::new(&proxy.seed().unwrap()).unwrap();
        let o = ClientOptions::default();
        let j = |c: &Credentials, nonce| -> Value {
            let auth = connect_auth(Some(c), &o, Some(nonce), Some(&pkey));
            serde_json::from_slice(&o.upstream_connect_json(&auth, 4096).unwrap()).unwrap()
        };
        let v = j(&Credentials::Nkey(seed.clone()), "nonce-one");
        assert_eq!(v["nkey"], user.public_key());
        assert!(verify(
            &user.public_key(),
            "nonce-one",
            v["sig"].as_str().unwrap()
        ));
        assert!(verify(
            &proxy.public_key(),
            "nonce-one",
            v["proxy_sig"].as_str().unwrap()
        ));
        // The next node's nonce gets its own signature.
        let w = j(&Credentials::Nkey(seed.clone()), "nonce-two");
        assert_ne!(v["sig"], w["sig"]);
        assert!(verify(
            &user.public_key(),
            "nonce-two",
            w["sig"].as_str().unwrap()
        ));

        let creds = format!(
            "-----BEGIN NATS USER JWT-----\neyJhIjoxfQ.eyJiIjoyfQ.c2ln\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        );
        let c = Credentials::from_creds(&creds).unwrap();
        let v = j(&c, "nonce-three");
        assert_eq!(v["jwt"], "eyJhIjoxfQ.eyJiIjoyfQ.c2ln");
        assert!(v.get("nkey").is_none());
        assert!(verify(
            &user.public_key(),
            "nonce-three",
            v["sig"].as_str().unwrap()
        ));
        // Nothing secret in Debug output.
        let shown = format!("{c:?} {:?} {pkey:?}", Credentials::Nkey(seed));
        assert!(!shown.contains(&user.seed().unwrap()) && !shown.contains(&proxy.seed().unwrap()));
        assert_eq!(Credentials::from_creds("garbage"), Err(CredsError::NoJwt));
        let bad_seed = creds.replace(&user.seed().unwrap()[..10], "SUAXXXXXXX");
        let e = Credentials::from_creds(&bad_seed).unwrap_err();
        assert!(matches!(e, CredsError::Seed(_)), "{e}");
        assert!(!e.to_string().contains("SUAXXXXXXX"), "{e}");
    }
}
