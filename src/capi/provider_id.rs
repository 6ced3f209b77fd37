//! Provider IDs: Cluster API matches a Machine to its Node by exact `providerID`, while Cluster
//! Autoscaler compares only the part after the last `/`. We keep the exact string for matching
//! and expose the normalised form for the places where providers disagree on the prefix (for
//! example `aws:///zone/i-1` on the Machine against `aws://zone/i-1` written by another tool).

use std::fmt;

/// The part of a provider ID after its last `/`, trimmed of surrounding whitespace:
/// `aws:///us-east-1a/i-0abc` gives `i-0abc`, `kubemark://m-1` gives `m-1`. A string without a
/// `/` is returned trimmed as it is; an empty string or one ending in `/` gives `""`, which
/// callers treat as "no ID".
pub fn normalize(provider_id: &str) -> &str {
    let trimmed = provider_id.trim();
    match trimmed.rsplit_once('/') {
        Some((_, tail)) => tail,
        None => trimmed,
    }
}

/// A non-empty provider ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderId(String);

impl ProviderId {
    /// `None` for an empty or blank string and for one whose normalised form is empty (such as
    /// `aws:///`), since neither can identify an instance.
    pub fn new(provider_id: impl Into<String>) -> Option<ProviderId> {
        let id: String = provider_id.into();
        let trimmed = id.trim();
        if trimmed.is_empty() || normalize(trimmed).is_empty() {
            return None;
        }
        Some(ProviderId(trimmed.to_string()))
    }

    /// The ID exactly as written (whitespace trimmed), which is what Cluster API compares.
    pub fn exact(&self) -> &str {
        &self.0
    }

    /// The instance part, see [`normalize`].
    pub fn normalized(&self) -> &str {
        normalize(&self.0)
    }

    /// The scheme before `://` (`aws`, `azure`, `gce`, ...), if there is one.
    pub fn scheme(&self) -> Option<&str> {
        self.0.split_once("://").map(|(scheme, _)| scheme)
    }

    /// True when both name the same instance by Cluster Autoscaler's rule.
    pub fn same_instance(&self, other: &ProviderId) -> bool {
        self.normalized() == other.normalized()
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ProviderId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_edge_cases() {
        assert_eq!(normalize(""), "");
        assert_eq!(normalize("   "), "");
        assert_eq!(normalize("i-0abc"), "i-0abc");
        assert_eq!(normalize("aws:///us-east-1a/"), "");
        assert_eq!(normalize(" kubemark://m-1 "), "m-1");
        assert_eq!(ProviderId::new(""), None);
        assert_eq!(ProviderId::new("aws:///"), None);
        assert_eq!(ProviderId::new("plain").unwrap().scheme(), None);
    }
}
