//! What the `bus` command logs: the library's `tracing` events on stderr,
//! warnings and errors always, more with `-v` / `-vv` / `-vvv`, or exactly
//! what `RUST_LOG` asks for when it is set.

use tracing_subscriber::EnvFilter;

/// The filter for `verbose` `-v` flags when `RUST_LOG` is not set.
fn default_filter(verbose: u8) -> &'static str {
    match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    }
}

/// Installs the stderr subscriber once, before any bus is opened.
pub fn install(verbose: u8) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::new(spec),
        _ => EnvFilter::new(default_filter(verbose)),
    };
    // Data goes to stdout; logs never mix into it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::default_filter;

    #[test]
    fn each_v_adds_a_level() {
        assert_eq!(default_filter(0), "warn");
        assert_eq!(default_filter(1), "info");
        assert_eq!(default_filter(2), "debug");
        assert_eq!(default_filter(9), "trace");
    }
}
