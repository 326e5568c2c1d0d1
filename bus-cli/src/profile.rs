//! Named profiles (like `nats context`): a URL and where its secret comes
//! from, kept in `profiles.toml` in the user's config directory
//! (`$XDG_CONFIG_HOME/bus`, `~/.config/bus`; `BUS_CONFIG` names another file).
//!
//! The file never holds a secret: a profile names an environment variable or
//! a file to read the password or token from when the profile is used.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use bus::BusError;
use serde::{Deserialize, Serialize};

use super::exit::Failure;
use super::redact::redact;

/// One profile.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The bus URL, without a password or token in it.
    pub url: String,
    /// Environment variable holding the password (for `user@` in the URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// File holding the password (first line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// Environment variable holding a token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// File holding a token (first line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

/// The profiles file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    profiles: BTreeMap<String, Profile>,
}

/// Where the profiles live.
pub fn path() -> Result<PathBuf, BusError> {
    if let Some(path) = std::env::var_os("BUS_CONFIG") {
        return Ok(PathBuf::from(path));
    }
    use etcetera::BaseStrategy;
    let strategy = etcetera::choose_base_strategy().map_err(|error| {
        BusError::invalid(
            "profile",
            format!("no config directory ({error}); set BUS_CONFIG to a file path"),
        )
    })?;
    Ok(strategy.config_dir().join("bus").join("profiles.toml"))
}

fn load() -> Result<(PathBuf, File), BusError> {
    let path = path()?;
    let file = match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text).map_err(|error| {
            BusError::invalid(
                "profile",
                format!(
                    "{} is not a valid profiles file: {}",
                    path.display(),
                    error.message()
                ),
            )
        })?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => File::default(),
        Err(error) => return Err(BusError::Io(error)),
    };
    Ok((path, file))
}

/// Whether `url` carries a secret of its own (`user:password@`, a secret
/// query parameter, or `X@` that is a token because no password goes with
/// it): profiles refuse those.
fn has_inline_secret(url: &str, password_given: bool) -> bool {
    let user = user_of(url);
    if user.is_some_and(|user| user.contains(':')) || (user.is_some() && !password_given) {
        return true;
    }
    let without_user = match (url.split_once("://"), user) {
        (Some((scheme, rest)), Some(user)) => format!("{scheme}://{}", &rest[user.len() + 1..]),
        _ => url.to_owned(),
    };
    redact(&without_user) != without_user
}

/// Whether `url` names a user (`user@host`) without a password.
fn user_of(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next()?;
    authority.rsplit_once('@').map(|(user, _)| user)
}

fn read_secret(env: Option<&String>, file: Option<&PathBuf>) -> Result<Option<String>, BusError> {
    if let Some(var) = env {
        return std::env::var(var).map(Some).map_err(|_| {
            BusError::invalid("profile", format!("environment variable {var} is not set"))
        });
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|error| {
            BusError::invalid(
                "profile",
                format!("cannot read secret file {}: {error}", path.display()),
            )
        })?;
        return Ok(Some(text.lines().next().unwrap_or("").to_owned()));
    }
    Ok(None)
}

fn encode(secret: &str) -> String {
    let mut out = String::with_capacity(secret.len());
    for byte in secret.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl Profile {
    /// The URL to connect with: the profile's, with its secret put in.
    pub fn resolve(&self) -> Result<String, BusError> {
        let password = read_secret(self.password_env.as_ref(), self.password_file.as_ref())?;
        let token = read_secret(self.token_env.as_ref(), self.token_file.as_ref())?;
        let Some((scheme, rest)) = self.url.split_once("://") else {
            return Ok(self.url.clone());
        };
        Ok(match (password, token, user_of(&self.url)) {
            (Some(password), _, Some(user)) => {
                let hosts = &rest[user.len() + 1..];
                format!("{scheme}://{user}:{}@{hosts}", encode(&password))
            }
            (Some(_), _, None) => {
                return Err(BusError::invalid(
                    "profile",
                    "a password needs a user in the URL (scheme://USER@host)",
                ));
            }
            (None, Some(token), _) => format!("{scheme}://{}@{rest}", encode(&token)),
            (None, None, _) => self.url.clone(),
        })
    }
}

/// The URL of profile `name`.
pub fn url_of(name: &str) -> Result<String, Failure> {
    let (path, file) = load()?;
    match file.profiles.get(name) {
        Some(profile) => Ok(profile.resolve()?),
        None => Err(Failure::NotFound(format!(
            "no profile {name:?} in {} (bus profile add {name} URL)",
            path.display()
        ))),
    }
}

/// `profile add NAME`.
pub fn add(name: &str, profile: Profile, out: &mut impl Write) -> Result<(), Failure> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(BusError::invalid("profile", "a profile name is [A-Za-z0-9._-]+").into());
    }
    let password_given = profile.password_env.is_some() || profile.password_file.is_some();
    if has_inline_secret(&profile.url, password_given) {
        return Err(BusError::invalid(
            "url",
            "a profile keeps no secret in its URL: put USER@ in it and pass --password-env VAR or --password-file PATH (or --token-env / --token-file)",
        )
        .into());
    }
    let sources = [
        profile.password_env.is_some(),
        profile.password_file.is_some(),
        profile.token_env.is_some(),
        profile.token_file.is_some(),
    ];
    if sources.iter().filter(|&&set| set).count() > 1 {
        return Err(BusError::invalid("profile", "give one secret source, not several").into());
    }
    let (path, mut file) = load()?;
    file.profiles.insert(name.to_owned(), profile);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = toml::to_string(&file)
        .map_err(|error| BusError::invalid("profile", format!("cannot write: {error}")))?;
    std::fs::write(&path, text)?;
    writeln!(out, "saved profile {name} in {}", path.display())?;
    Ok(())
}

/// `profile ls`: one line per profile, name and URL (redacted).
pub fn list(out: &mut impl Write) -> Result<(), Failure> {
    let (_, file) = load()?;
    for (name, profile) in &file.profiles {
        writeln!(out, "{name}\t{}", redact(&profile.url))?;
    }
    Ok(())
}

/// `profile show NAME`: the profile as JSON, its resolved URL redacted.
pub fn show(name: &str, out: &mut impl Write) -> Result<(), Failure> {
    let (path, file) = load()?;
    let Some(profile) = file.profiles.get(name) else {
        return Err(Failure::NotFound(format!(
            "no profile {name:?} in {}",
            path.display()
        )));
    };
    let mut value = serde_json::to_value(profile)?;
    value["name"] = name.into();
    value["url"] = redact(&profile.url).into();
    value["resolved_url"] = match profile.resolve() {
        Ok(url) => redact(&url).into(),
        Err(error) => format!("unresolved: {error}").into(),
    };
    writeln!(out, "{value}")?;
    Ok(())
}
