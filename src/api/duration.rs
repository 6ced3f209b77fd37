//! Go-style durations ("1h2m3.5s", "500ms", "10m"), the text form Karpenter's API uses, and
//! `NillableDuration` for fields that also accept "Never".
//!
//! Values are formatted compactly ("1h30m", not Go's "1h30m0s") so that the usual hand-written
//! manifests round-trip unchanged; the parser accepts both forms.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The word upstream uses for "no duration: never".
pub const NEVER: &str = "Never";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid duration {0:?}: empty")]
    Empty(String),
    #[error("invalid duration {0:?}: expected a number followed by a unit (h, m, s, ms, us, ns)")]
    Syntax(String),
    #[error("invalid duration {0:?}: unknown unit {1:?} (use h, m, s, ms, us or ns)")]
    Unit(String, String),
    #[error("invalid duration {0:?}: negative durations are not allowed")]
    Negative(String),
    #[error("invalid duration {0:?}: too large")]
    Overflow(String),
}

const NANOS_PER_UNIT: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go duration string. "0" alone is accepted (as Go does); a sign is only accepted
/// as "+" because a negative wait has no meaning in this API.
pub fn parse(text: &str) -> Result<Duration, Error> {
    let err_syntax = || Error::Syntax(text.to_string());
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if text.starts_with('-') {
        return Err(Error::Negative(text.to_string()));
    }
    if rest.is_empty() {
        return Err(Error::Empty(text.to_string()));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_part, after_int) = rest.split_at(int_len);
        let (frac_part, after_num) = match after_int.strip_prefix('.') {
            Some(f) => {
                let n = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                f.split_at(n)
            }
            None => ("", after_int),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(err_syntax());
        }
        let unit_len = after_num
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after_num.len());
        let (unit, next) = after_num.split_at(unit_len);
        if unit.is_empty() {
            return Err(err_syntax());
        }
        let scale = NANOS_PER_UNIT
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, s)| *s)
            .ok_or_else(|| Error::Unit(text.to_string(), unit.to_string()))?;
        let overflow = || Error::Overflow(text.to_string());
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| overflow())?
        };
        let mut nanos = whole.checked_mul(scale).ok_or_else(overflow)?;
        // Fractions finer than a nanosecond are dropped, as Go does.
        let mut place = scale;
        for digit in frac_part.bytes() {
            place /= 10;
            if place == 0 {
                break;
            }
            nanos += u128::from(digit - b'0') * place;
        }
        total_nanos = total_nanos.checked_add(nanos).ok_or_else(overflow)?;
        rest = next;
    }
    let secs =
        u64::try_from(total_nanos / 1_000_000_000).map_err(|_| Error::Overflow(text.into()))?;
    // The remainder is below 1e9 so it always fits.
    let sub = (total_nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

/// Formats a duration compactly in Go syntax: "720h", "1h30m", "1h0m5s", "1.5s", "500ms", "0s".
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (unit, scale) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("us", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", decimal(nanos, scale));
    }
    let total_secs = d.as_secs();
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let secs = total_secs % 60;
    let sub = d.subsec_nanos();
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    let has_seconds = secs > 0 || sub > 0;
    if minutes > 0 || (hours > 0 && has_seconds) {
        out.push_str(&format!("{minutes}m"));
    }
    if has_seconds {
        let s = u128::from(secs) * 1_000_000_000 + u128::from(sub);
        out.push_str(&format!("{}s", decimal(s, 1_000_000_000)));
    }
    out
}

/// `value / scale` as a decimal with trailing zeros trimmed.
fn decimal(value: u128, scale: u128) -> String {
    let whole = value / scale;
    let frac = value % scale;
    if frac == 0 {
        return whole.to_string();
    }
    let width = scale.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// A duration serialized as Go text ("10m"); used where upstream has a `metav1.Duration`-like
/// string without the "Never" escape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub Duration);

impl GoDuration {
    pub fn from_secs(secs: u64) -> Self {
        GoDuration(Duration::from_secs(secs))
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format(self.0))
    }
}

impl std::str::FromStr for GoDuration {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        parse(s).map(GoDuration)
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        GoDuration(d)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(self.0))
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(d)?;
        parse(&text)
            .map(GoDuration)
            .map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for GoDuration {
    fn schema_name() -> Cow<'static, str> {
        "GoDuration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "pattern": "^([0-9]+(s|m|h))+$" })
    }
}

/// A duration that may be "Never" (upstream's `NillableDuration`): `expireAfter`,
/// `consolidateAfter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NillableDuration {
    Never,
    After(Duration),
}

impl Default for NillableDuration {
    fn default() -> Self {
        NillableDuration::After(Duration::ZERO)
    }
}

impl NillableDuration {
    /// The wait, or `None` for "Never".
    pub fn duration(&self) -> Option<Duration> {
        match self {
            NillableDuration::Never => None,
            NillableDuration::After(d) => Some(*d),
        }
    }

    pub fn is_never(&self) -> bool {
        matches!(self, NillableDuration::Never)
    }

    pub fn from_secs(secs: u64) -> Self {
        NillableDuration::After(Duration::from_secs(secs))
    }
}

impl fmt::Display for NillableDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NillableDuration::Never => f.write_str(NEVER),
            NillableDuration::After(d) => f.write_str(&format(*d)),
        }
    }
}

impl std::str::FromStr for NillableDuration {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        if s == NEVER {
            Ok(NillableDuration::Never)
        } else {
            parse(s).map(NillableDuration::After)
        }
    }
}

impl Serialize for NillableDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for NillableDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for NillableDuration {
    fn schema_name() -> Cow<'static, str> {
        "NillableDuration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "pattern": "^(([0-9]+(s|m|h))+|Never)$" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_go_durations() {
        let cases: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("10m", Duration::from_secs(600)),
            ("720h", Duration::from_secs(720 * 3600)),
            ("1h30m", Duration::from_secs(5400)),
            ("1h30m0s", Duration::from_secs(5400)),
            ("1h2m3.5s", ms(3_723_500)),
            ("500ms", ms(500)),
            ("1.5h", Duration::from_secs(5400)),
            (".5s", ms(500)),
            ("2us", Duration::from_micros(2)),
            ("2µs", Duration::from_micros(2)),
            ("7ns", Duration::from_nanos(7)),
            ("+5s", Duration::from_secs(5)),
            ("1m1m", Duration::from_secs(120)),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).unwrap(), *want, "{text}");
        }
    }

    #[test]
    fn rejects_bad_durations() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("10", "number followed by a unit"),
            ("h", "number followed by a unit"),
            ("10x", "unknown unit \"x\""),
            ("1d", "unknown unit \"d\""),
            ("-5s", "negative"),
            ("Never", "number followed by a unit"),
            ("5 m", "unknown unit"),
            ("99999999999999999999999999999999999999999h", "too large"),
        ];
        for (text, want) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn formats_compactly_and_round_trips() {
        let cases: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_secs(600), "10m"),
            (Duration::from_secs(720 * 3600), "720h"),
            (Duration::from_secs(5400), "1h30m"),
            (Duration::from_secs(3605), "1h0m5s"),
            (ms(3_723_500), "1h2m3.5s"),
            (ms(1500), "1.5s"),
            (ms(500), "500ms"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::from_secs(59), "59s"),
        ];
        for (d, want) in cases {
            assert_eq!(format(*d), *want);
            assert_eq!(parse(want).unwrap(), *d, "{want} round trip");
        }
    }

    #[test]
    fn nillable_serde_uses_upstream_strings() {
        let never: NillableDuration = serde_json::from_str("\"Never\"").unwrap();
        assert_eq!(never, NillableDuration::Never);
        assert_eq!(serde_json::to_string(&never).unwrap(), "\"Never\"");
        let d: NillableDuration = serde_json::from_str("\"720h\"").unwrap();
        assert_eq!(d.duration(), Some(Duration::from_secs(720 * 3600)));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"720h\"");
        assert!(serde_json::from_str::<NillableDuration>("\"never\"").is_err());
        let g: GoDuration = serde_json::from_str("\"10m\"").unwrap();
        assert_eq!(g.0, Duration::from_secs(600));
        assert!(serde_json::from_str::<GoDuration>("\"Never\"").is_err());
    }
}
