//! How `run`'s flag values are read: each parser refuses a bad value with a message that names
//! what is wrong, so clap reports it as a usage error with its flag, before anything starts.

use std::path::PathBuf;
use std::time::Duration;

/// The longest wait any duration flag accepts. Longer values are certainly typos, and bounding
/// them keeps every `Instant + duration` in the controller far from overflow (which panics).
pub(crate) const MAX_FLAG_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Go-style duration ("90s", "5m", "1h30m") for flags, so values read like Karpenter's; at most
/// [`MAX_FLAG_DURATION`]. Zero is allowed (see [`positive_duration_arg`] for waits that must not
/// be zero).
pub(crate) fn duration_arg(s: &str) -> Result<Duration, String> {
    // A bare number is refused in every subcommand alike: "15" could mean seconds or minutes.
    if s != "0" && s.trim().parse::<f64>().is_ok() {
        return Err(format!(
            "{s:?} has no unit: write it with one, e.g. {0}s or {0}m",
            s.trim()
        ));
    }
    let d = crate::api::duration::parse(s).map_err(|e| e.to_string())?;
    if d > MAX_FLAG_DURATION {
        return Err(format!(
            "{s:?} is longer than the maximum of {}",
            crate::api::duration::format(MAX_FLAG_DURATION)
        ));
    }
    Ok(d)
}

/// A Go-style duration that must be greater than zero (a zero timeout or batch window would make
/// the controller give up, or spin, immediately).
pub(crate) fn positive_duration_arg(s: &str) -> Result<Duration, String> {
    let d = duration_arg(s)?;
    if d.is_zero() {
        return Err(format!("{s:?} must be greater than zero"));
    }
    Ok(d)
}

/// A tracing filter (`info`, `karpenter_capi=debug,kube=warn`), checked when the flag is parsed so
/// a typo is a usage error, not a start-up failure.
pub(crate) fn log_level_arg(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("{s:?} is not a log level or tracing filter: {e}"))
}

/// A DNS-1123 label (namespaces).
pub(crate) fn dns_label_arg(s: &str) -> Result<String, String> {
    if crate::api::validation::dns_label(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a valid namespace name (lower-case letters, digits and '-', at most 63, starting and ending alphanumeric)"
        ))
    }
}

/// A DNS-1123 subdomain (object names such as the Lease's).
pub(crate) fn dns_subdomain_arg(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a valid object name (lower-case DNS subdomain, at most 253 characters)"
        ))
    }
}

/// A label value (the Cluster's name is matched against the `cluster.x-k8s.io/cluster-name` label).
pub(crate) fn label_value_arg(s: &str) -> Result<String, String> {
    crate::api::validation::label_value(s).map(|()| s.to_string())
}

/// An http(s) URL of an API server.
pub(crate) fn url_arg(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .ok_or_else(|| format!("{s:?} is not an http:// or https:// URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.chars().any(char::is_whitespace) {
        return Err(format!("{s:?} has no valid host"));
    }
    Ok(s.to_string())
}

/// A file that exists (a kubeconfig): a missing file is a usage error, named with its flag.
pub(crate) fn existing_file_arg(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!("{s:?} is not a readable file"))
    }
}

/// A path that is not empty (an empty one would only fail later, less clearly).
pub(crate) fn non_empty_path_arg(s: &str) -> Result<PathBuf, String> {
    if s.trim().is_empty() {
        Err("the path is empty".to_string())
    } else {
        Ok(PathBuf::from(s))
    }
}

/// Base64 as in a kubeconfig's certificate-authority-data (standard alphabet, padded).
pub(crate) fn base64_arg(s: &str) -> Result<String, String> {
    let t = s.trim();
    let ok = !t.is_empty()
        && t.len().is_multiple_of(4)
        && t.trim_end_matches('=')
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
        && t.len() - t.trim_end_matches('=').len() <= 2;
    if ok {
        Ok(t.to_string())
    } else {
        Err("the value is not base64 (a PEM bundle encoded as in a kubeconfig's certificate-authority-data)".to_string())
    }
}
