//! S3 credentials and region, found as the AWS tools find them: the
//! environment, then the shared credentials file, then the config file.
//! None found means anonymous requests (public objects).

use std::collections::HashMap;
use std::path::PathBuf;

/// An access key, its secret and maybe a session token. `Debug` shows
/// the key id only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub(crate) key: String,
    pub(crate) secret: String,
    pub(crate) token: Option<String>,
}

impl Credentials {
    /// Credentials from a key id, a secret and an optional session token.
    pub fn new(key: impl Into<String>, secret: impl Into<String>, token: Option<String>) -> Self {
        Credentials {
            key: key.into(),
            secret: secret.into(),
            token,
        }
    }

    pub(crate) fn to_s3(&self) -> rusty_s3::Credentials {
        match &self.token {
            Some(t) => rusty_s3::Credentials::new_with_token(&self.key, &self.secret, t),
            None => rusty_s3::Credentials::new(&self.key, &self.secret),
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("key", &self.key)
            .field("secret", &"<redacted>")
            .field(
                "token",
                &self.token.as_ref().map(|_| "<redacted>").unwrap_or("none"),
            )
            .finish()
    }
}

/// What the AWS environment says: credentials (if any) and region (if any).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AwsConfig {
    /// `None`: requests go unsigned.
    pub credentials: Option<Credentials>,
    /// The region, if the environment or config file names one.
    pub region: Option<String>,
    /// Where the credentials came from (for messages; never the secret).
    pub source: &'static str,
}

impl AwsConfig {
    /// Looks in the process environment and the files it points at.
    pub fn from_env() -> AwsConfig {
        Self::load(&|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// As [`AwsConfig::from_env`], with `env` standing in for the
    /// environment (tests).
    pub fn load(env: &dyn Fn(&str) -> Option<String>) -> AwsConfig {
        let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let home = env("HOME").map(PathBuf::from);
        let file = |var: &str, name: &str| {
            env(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
                .and_then(|p| std::fs::read_to_string(p).ok())
                .map(|text| parse_ini(&text))
                .unwrap_or_default()
        };
        let creds_file = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        let config_file = file("AWS_CONFIG_FILE", "config");
        // The config file names sections `[profile X]`, except `[default]`.
        let config_section = config_file
            .get(&format!("profile {profile}"))
            .or_else(|| config_file.get(&profile));
        let from_section = |s: &HashMap<String, String>| {
            Some(Credentials::new(
                s.get("aws_access_key_id")?.clone(),
                s.get("aws_secret_access_key")?.clone(),
                s.get("aws_session_token").cloned(),
            ))
        };
        let (credentials, source) =
            if let (Some(k), Some(s)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                (
                    Some(Credentials::new(k, s, env("AWS_SESSION_TOKEN"))),
                    "environment",
                )
            } else if let Some(c) = creds_file.get(&profile).and_then(from_section) {
                (Some(c), "credentials file")
            } else if let Some(c) = config_section.and_then(from_section) {
                (Some(c), "config file")
            } else {
                (None, "none (anonymous)")
            };
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| config_section.and_then(|s| s.get("region").cloned()));
        AwsConfig {
            credentials,
            region,
            source,
        }
    }
}

/// `[section]` headers and `key = value` lines; `#` and `;` start comments.
fn parse_ini(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            out.entry(name.clone()).or_default();
            section = Some(name);
        } else if let (Some(s), Some((k, v))) = (&section, line.split_once('=')) {
            out.entry(s.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn environment_first_then_files() {
        let dir = tempfile::tempdir().unwrap();
        let aws = dir.path().join(".aws");
        std::fs::create_dir(&aws).unwrap();
        std::fs::write(
            aws.join("credentials"),
            "[default]\naws_access_key_id = DK\naws_secret_access_key = DS\n\n[dev]\naws_access_key_id=PK\naws_secret_access_key=PS\naws_session_token=PT\n",
        )
        .unwrap();
        std::fs::write(
            aws.join("config"),
            "[default]\nregion = eu-central-1\n# note\n[profile dev]\nregion=ap-south-1\n[profile cfg]\naws_access_key_id = CK\naws_secret_access_key = CS\n",
        )
        .unwrap();
        let home = dir.path().to_str().unwrap().to_owned();

        let c = AwsConfig::load(&env_of(&[
            ("HOME", home.clone()),
            ("AWS_ACCESS_KEY_ID", "EK".into()),
            ("AWS_SECRET_ACCESS_KEY", "ES".into()),
            ("AWS_REGION", "us-west-2".into()),
        ]));
        assert_eq!(c.credentials, Some(Credentials::new("EK", "ES", None)));
        assert_eq!(c.region.as_deref(), Some("us-west-2"));

        let c = AwsConfig::load(&env_of(&[("HOME", home.clone())]));
        assert_eq!(c.credentials, Some(Credentials::new("DK", "DS", None)));
        assert_eq!(c.region.as_deref(), Some("eu-central-1"));

        let c = AwsConfig::load(&env_of(&[
            ("HOME", home.clone()),
            ("AWS_PROFILE", "dev".into()),
        ]));
        assert_eq!(
            c.credentials,
            Some(Credentials::new("PK", "PS", Some("PT".into())))
        );
        assert_eq!(c.region.as_deref(), Some("ap-south-1"));

        let c = AwsConfig::load(&env_of(&[
            ("HOME", home.clone()),
            ("AWS_PROFILE", "cfg".into()),
        ]));
        assert_eq!(c.credentials, Some(Credentials::new("CK", "CS", None)));

        let other = dir.path().join("elsewhere");
        std::fs::write(
            &other,
            "[default]\naws_access_key_id=FK\naws_secret_access_key=FS\n",
        )
        .unwrap();
        let c = AwsConfig::load(&env_of(&[
            ("HOME", home),
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                other.to_str().unwrap().into(),
            ),
            ("AWS_DEFAULT_REGION", "sa-east-1".into()),
        ]));
        assert_eq!(c.credentials, Some(Credentials::new("FK", "FS", None)));
        assert_eq!(c.region.as_deref(), Some("sa-east-1"));
    }

    #[test]
    fn nothing_found_is_anonymous() {
        let c = AwsConfig::load(&env_of(&[("HOME", "/nonexistent".into())]));
        assert_eq!(c.credentials, None);
        assert_eq!(c.region, None);
    }

    #[test]
    fn debug_hides_secrets() {
        let c = Credentials::new("AKIDEXAMPLE", "very-secret", Some("tok-secret".into()));
        let shown = format!(
            "{c:?} {:?}",
            AwsConfig {
                credentials: Some(c.clone()),
                ..AwsConfig::default()
            }
        );
        assert!(shown.contains("AKIDEXAMPLE"));
        assert!(
            !shown.contains("very-secret") && !shown.contains("tok-secret"),
            "{shown}"
        );
    }
}
