//! Go's duration strings (`time.ParseDuration`), as Cluster API's `nodeDrainTimeout` and
//! Karpenter's `do-not-disrupt` grace periods are written: a sequence of decimal numbers with
//! units ("1h30m", "2.5s"), or "0". The stand-ins have no use for a negative duration, so a
//! sign other than "+" is not one.

use std::time::Duration;

/// Nanoseconds per unit, Go's units.
const UNITS: [(&str, u128); 7] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// `text` as a duration, `None` when it is not a non-negative Go duration.
pub fn parse(text: &str) -> Option<Duration> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let (term, next) = term(rest)?;
        nanos = nanos.checked_add(term)?;
        rest = next;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

/// The first number-and-unit of `text` in nanoseconds (fractions of a nanosecond dropped, as
/// Go drops them), and what follows it.
fn term(text: &str) -> Option<(u128, &str)> {
    let int_len = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (int, after) = text.split_at(int_len);
    let (frac, after) = match after.strip_prefix('.') {
        Some(f) => f.split_at(f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len())),
        None => ("", after),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let unit_len = after
        .find(|c: char| c.is_ascii_digit() || c == '.')
        .unwrap_or(after.len());
    let (unit, next) = after.split_at(unit_len);
    let scale = UNITS.iter().find(|(u, _)| *u == unit).map(|(_, s)| *s)?;
    let whole = if int.is_empty() {
        0
    } else {
        int.parse::<u128>().ok()?
    };
    let mut nanos = whole.checked_mul(scale)?;
    // The fraction's digits, each worth a tenth of the one before.
    let mut place = scale;
    for d in frac.bytes() {
        place /= 10;
        nanos = nanos.checked_add(u128::from(d - b'0') * place)?;
    }
    Some((nanos, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_go_durations() {
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse("+1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("2.5s"), Some(Duration::from_millis(2500)));
        assert_eq!(parse("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("100ms"), Some(Duration::from_millis(100)));
        assert_eq!(parse("3µs"), Some(Duration::from_micros(3)));
    }

    #[test]
    fn refuses_what_is_not_one() {
        for bad in ["", "true", "10", "-5s", "5x", "s", ".s", "1h-2m"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
