//! Minimal Kubernetes quantity parsing for the stand-ins (the scheduler's fit check and the
//! kubelet's capacity). Values are kept in milli-units as i128 so cpu ("250m") and memory
//! ("16Gi") share one exact representation. `None` means "not a quantity": callers treat it as
//! absent rather than panicking.

/// `s` in thousandths of a unit, rounded up (Kubernetes rounds requests up too).
pub fn parse_milli(s: &str) -> Option<i128> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (mantissa, scale) = parse_decimal(number)?;
    let (base, exp): (i128, u32) = match suffix {
        "" => (10, 0),
        "n" => return scaled(mantissa, scale + 6, 0),
        "u" => return scaled(mantissa, scale + 3, 0),
        "m" => return scaled(mantissa, scale, 0),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        "Ki" => (2, 10),
        "Mi" => (2, 20),
        "Gi" => (2, 30),
        "Ti" => (2, 40),
        "Pi" => (2, 50),
        "Ei" => (2, 60),
        other => {
            // Decimal exponent form: 1e3, 1E3.
            let digits = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))?;
            let exp: u32 = digits.parse().ok()?;
            (10, exp)
        }
    };
    let multiplier = base.checked_pow(exp)?.checked_mul(1000)?;
    scaled(mantissa, scale, multiplier)
}

/// Digits of `number` as an integer plus how many of them were after the decimal point.
fn parse_decimal(number: &str) -> Option<(i128, u32)> {
    let (negative, digits) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let all = format!("{int}{frac}");
    if !all.chars().all(|c| c.is_ascii_digit()) || all.len() > 30 {
        return None;
    }
    let value: i128 = all.parse().ok()?;
    let scale = u32::try_from(frac.len()).ok()?;
    Some((if negative { -value } else { value }, scale))
}

/// `mantissa / 10^scale * multiplier` rounded up; multiplier 0 means "already in milli-units
/// before dividing by 10^scale".
fn scaled(mantissa: i128, scale: u32, multiplier: i128) -> Option<i128> {
    let numerator = if multiplier == 0 {
        mantissa
    } else {
        mantissa.checked_mul(multiplier)?
    };
    let divisor = 10i128.checked_pow(scale)?;
    let q = numerator.div_euclid(divisor);
    Some(if numerator.rem_euclid(divisor) == 0 {
        q
    } else {
        q + 1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("250m"), Some(250));
        assert_eq!(parse_milli("0.5"), Some(500));
        assert_eq!(parse_milli("4Gi"), Some(4 * (1 << 30) * 1000));
        assert_eq!(parse_milli("4G"), Some(4_000_000_000_000));
        assert_eq!(parse_milli("1e3"), Some(1_000_000));
        assert_eq!(parse_milli("1.5Ki"), Some(1536 * 1000));
        assert_eq!(parse_milli("100n"), Some(1));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "abc", "1x", "Gi", "1..2", "--1"] {
            assert_eq!(parse_milli(bad), None, "{bad}");
        }
    }
}
