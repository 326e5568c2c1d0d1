//! The one place secrets are taken out of text the `bus` command prints.
//!
//! Every error line, warning and progress message goes through [`redact`]:
//! a URL's `user:password@` or `token@`, secret query parameters
//! (`password=`, `token=`, `creds=`, ...) and any `.creds` path become `***`.

/// What stands in for a secret.
pub const MASK: &str = "***";

/// Query parameters whose values are secrets (or say where one is).
const SECRET_PARAMS: &[&str] = &[
    "password",
    "pass",
    "token",
    "creds",
    "nkey",
    "secret",
    "sasl_password",
    "control_key",
];

/// Characters that end a URL or a path inside a message.
fn ends_word(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '`' | ')' | '(' | '<' | '>' | ',' | ';')
}

/// `text` with every secret it holds replaced by [`MASK`].
pub fn redact(text: &str) -> String {
    let text = redact_userinfo(text);
    let text = redact_params(&text);
    redact_creds_paths(&text)
}

/// `scheme://user:password@host` → `scheme://user:***@host`, `scheme://token@host` → `scheme://***@host`.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| ends_word(c) || matches!(c, '/' | '?' | '#'))
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(split) => {
                let userinfo = &authority[..split];
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(MASK);
                    }
                    None => out.push_str(MASK),
                }
                out.push_str(&authority[split..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

/// `?password=x&token=y` → `?password=***&token=***`.
fn redact_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    let mut copied = 0;
    let mut previous = None;
    while let Some((index, c)) = chars.next() {
        // A parameter name starts a word: after `?`, `&`, a quote, a space.
        let starts_word = !previous.is_some_and(|p: char| p.is_alphanumeric() || p == '_');
        previous = Some(c);
        if !starts_word {
            continue;
        }
        let after = &text[index..];
        let Some(name_len) = SECRET_PARAMS
            .iter()
            .find(|name| {
                after
                    .get(..name.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(name))
                    && after[name.len()..].starts_with('=')
            })
            .map(|name| name.len())
            .or_else(|| secret_pass_through(after))
        else {
            continue;
        };
        let value_start = index + name_len + 1;
        let value_len = text[value_start..]
            .find(|c: char| c == '&' || ends_word(c))
            .unwrap_or(text.len() - value_start);
        out.push_str(&text[copied..value_start]);
        out.push_str(MASK);
        copied = value_start + value_len;
        while chars.peek().is_some_and(|&(i, _)| i < copied) {
            previous = chars.next().map(|(_, c)| c);
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// The length of `rdkafka.NAME` at the start of `text` when it is followed
/// by `=` and NAME is a librdkafka setting that holds a secret
/// (`rdkafka.ssl.key.pem=`, `rdkafka.sasl.oauthbearer.config=`, ...).
fn secret_pass_through(text: &str) -> Option<usize> {
    const PREFIX: &str = "rdkafka.";
    if !text
        .get(..PREFIX.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(PREFIX))
    {
        return None;
    }
    let end = text.find(|c: char| c == '=' || c == '&' || ends_word(c))?;
    (text[end..].starts_with('=') && bus_core::backend::is_secret_setting(&text[PREFIX.len()..end]))
        .then_some(end)
}

/// Any `…/name.creds` path → `***.creds` (the path says whose credentials).
fn redact_creds_paths(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = text[search..].find(".creds") {
        let suffix = search + found;
        let start = text[..suffix]
            .rfind(|c: char| ends_word(c) || c == '=')
            .map_or(0, |i| {
                i + text[i..].chars().next().map_or(1, char::len_utf8)
            });
        out.push_str(&text[copied..start.max(copied)]);
        out.push_str(MASK);
        out.push_str(".creds");
        copied = suffix + ".creds".len();
        search = copied;
    }
    out.push_str(&text[copied..]);
    out
}

/// `text` on one line: newlines (a backend's multi-line message) become `; `.
pub fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_tokens_and_creds_paths_are_masked() {
        let text = redact(
            "cannot reach tls://alice:S3cret-pw@nats.example:4222?ca=/etc/ca.pem&token=T0ken-x and nats://T0ken-y@h:4222, creds file \"/home/alice/keys/alice.creds\" unreadable",
        );
        for secret in [
            "S3cret-pw",
            "T0ken-x",
            "T0ken-y",
            "/home/alice",
            "keys/alice",
        ] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        assert!(text.contains("tls://alice:***@nats.example:4222"), "{text}");
        assert!(
            text.contains("ca=/etc/ca.pem"),
            "harmless parts stay: {text}"
        );
        assert!(text.contains("nats://***@h:4222"), "{text}");
        assert!(text.contains("\"***.creds\""), "{text}");
    }

    #[test]
    fn secret_librdkafka_settings_are_masked_and_others_kept() {
        let text = redact(
            "kafkas://h:9093?rdkafka.ssl.key.pem=PEMDATA&rdkafka.sasl.oauthbearer.config=principal=x&rdkafka.ssl.key.password=Kp1&rdkafka.client.id=auditor",
        );
        for secret in ["PEMDATA", "principal=x", "Kp1"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        assert!(text.contains("rdkafka.client.id=auditor"), "{text}");
    }

    #[test]
    fn a_parameter_quoted_in_a_message_is_masked() {
        let text = redact("unknown file:// option \"token=T0ken-z\"; password=pw1");
        assert_eq!(text, "unknown file:// option \"token=***\"; password=***");
    }

    #[test]
    fn creds_query_parameter_is_masked_whole() {
        let text = redact("nats://h:4222?creds=/srv/user.creds&name=x");
        assert_eq!(text, "nats://h:4222?creds=***&name=x");
    }

    #[test]
    fn text_without_secrets_is_unchanged() {
        for text in [
            "unknown topic \"audit\" (provision it via the manifest first)",
            "file:///tmp/bus-data?read_only=true",
            "kafka://127.0.0.1:9092",
            "ünïcödé ?& = ://",
        ] {
            assert_eq!(redact(text), text);
        }
    }

    #[test]
    fn one_line_joins_lines() {
        assert_eq!(one_line("a\n  b\n\nc\n"), "a; b; c");
    }
}
