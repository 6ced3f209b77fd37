//! Exact Kubernetes resource quantities and resource lists.
//!
//! A [`Quantity`] holds its value as a signed number of nano-units in an `i128`, so every
//! quantity Kubernetes accepts (down to `1n`, up to far beyond `1Ei`) is represented exactly and
//! arithmetic never loses precision. Like Kubernetes, a value finer than one nano-unit is rounded
//! up (away from zero) when parsed. The notation the value was written in (binary, decimal SI or
//! decimal exponent) is remembered only to print it back the way Kubernetes would; equality and
//! ordering compare values alone, so `1Ki == 1024`.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

/// Nano-units per unit.
const NANOS: i128 = 1_000_000_000;

/// Why a quantity string was rejected. Every variant names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantity {input:?}: empty")]
    Empty { input: String },
    #[error("quantity {input:?}: expected a number, optionally signed, with optional fraction")]
    BadNumber { input: String },
    #[error("quantity {input:?}: unknown suffix {suffix:?}")]
    BadSuffix { input: String, suffix: String },
    #[error("quantity {input:?}: too large to represent")]
    Overflow { input: String },
}

/// How Kubernetes prints a quantity; kept from the input so output round-trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Powers of 1024: Ki, Mi, Gi, Ti, Pi, Ei.
    BinarySi,
    /// Powers of 1000: n, u, m, (none), k, M, G, T, P, E.
    #[default]
    DecimalSi,
    /// `<mantissa>e<exponent>`, exponent a multiple of three.
    DecimalExponent,
}

/// An exact Kubernetes quantity (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

impl Quantity {
    pub const ZERO: Quantity = Quantity {
        nanos: 0,
        format: Format::DecimalSi,
    };

    /// A whole number of units, printed in decimal SI (cpu "2", pods "110").
    pub fn from_units(units: i64) -> Self {
        Self::from_nanos(i128::from(units) * NANOS)
    }

    /// A number of milli-units (cpu "500m").
    pub fn from_millis(millis: i64) -> Self {
        Self::from_nanos(i128::from(millis) * 1_000_000)
    }

    /// A number of nano-units, the internal resolution.
    pub fn from_nanos(nanos: i128) -> Self {
        Quantity {
            nanos,
            format: Format::DecimalSi,
        }
    }

    /// A byte count printed with binary suffixes where exact (memory "4Gi").
    pub fn from_bytes(bytes: i64) -> Self {
        Quantity {
            nanos: i128::from(bytes) * NANOS,
            format: Format::BinarySi,
        }
    }

    /// The same value printed in another notation.
    pub fn with_format(self, format: Format) -> Self {
        Quantity { format, ..self }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn as_nanos(&self) -> i128 {
        self.nanos
    }

    /// Milli-units rounded up (away from zero), saturating at the `i64` range, as Kubernetes'
    /// `MilliValue` does for cpu.
    pub fn as_millis(&self) -> i64 {
        saturate_i64(div_away_from_zero(self.nanos, 1_000_000))
    }

    /// Whole units rounded up (away from zero), saturating at the `i64` range, as Kubernetes'
    /// `Value` does for memory and counts.
    pub fn as_units(&self) -> i64 {
        saturate_i64(div_away_from_zero(self.nanos, NANOS))
    }

    /// Approximate value in units, for scoring and metrics only, never for fit decisions.
    pub fn as_f64(&self) -> f64 {
        self.nanos as f64 / NANOS as f64
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// `None` on overflow. The result keeps `self`'s notation (or `other`'s when `self` is zero),
    /// as Kubernetes does.
    pub fn checked_add(self, other: Quantity) -> Option<Quantity> {
        let nanos = self.nanos.checked_add(other.nanos)?;
        Some(Quantity {
            nanos,
            format: self.result_format(other),
        })
    }

    /// `None` on overflow. The result may be negative.
    pub fn checked_sub(self, other: Quantity) -> Option<Quantity> {
        let nanos = self.nanos.checked_sub(other.nanos)?;
        Some(Quantity {
            nanos,
            format: self.result_format(other),
        })
    }

    /// Clamps at the representable range instead of overflowing; the range (about 1.7e29 units)
    /// is far beyond any real resource, so saturation never changes a realistic decision.
    pub fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(other.nanos),
            format: self.result_format(other),
        }
    }

    /// See [`Quantity::saturating_add`]. The result may be negative.
    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_sub(other.nanos),
            format: self.result_format(other),
        }
    }

    /// Multiplies by a count (e.g. per-pod overhead times pods), saturating.
    pub fn saturating_mul(self, factor: i64) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_mul(i128::from(factor)),
            format: self.format,
        }
    }

    fn result_format(&self, other: Quantity) -> Format {
        if self.nanos == 0 {
            other.format
        } else {
            self.format
        }
    }

    pub fn to_k8s(&self) -> K8sQuantity {
        K8sQuantity(self.to_string())
    }

    pub fn from_k8s(q: &K8sQuantity) -> Result<Self, QuantityError> {
        q.0.parse()
    }
}

fn saturate_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// Integer division rounding the magnitude up; `divisor` must be positive.
fn div_away_from_zero(value: i128, divisor: i128) -> i128 {
    let q = value / divisor;
    if value % divisor == 0 {
        q
    } else if value < 0 {
        q - 1
    } else {
        q + 1
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

impl FromStr for Quantity {
    type Err = QuantityError;

    /// Grammar (Kubernetes'): `[+-] (digits [. digits?] | . digits) [suffix]` where suffix is a
    /// binary SI suffix, a decimal SI suffix, or `e`/`E` followed by a signed integer exponent.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.is_empty() {
            return Err(QuantityError::Empty {
                input: input.to_string(),
            });
        }
        let bad_number = || QuantityError::BadNumber {
            input: input.to_string(),
        };
        let (negative, rest) = match input.as_bytes().first() {
            Some(b'-') => (true, &input[1..]),
            Some(b'+') => (false, &input[1..]),
            _ => (false, input),
        };
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (int_digits, frac_digits) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if frac_digits.contains('.') || (int_digits.is_empty() && frac_digits.is_empty()) {
            return Err(bad_number());
        }
        let scale = parse_suffix(input, suffix)?;

        // value = digits * 10^(pow10 - frac_len) * 2^pow2, expressed in nano-units.
        let mut digits: Vec<u8> = int_digits
            .bytes()
            .chain(frac_digits.bytes())
            .map(|b| b - b'0')
            .collect();
        multiply_digits(&mut digits, scale.pow2);
        let frac_len = i64::try_from(frac_digits.len()).map_err(|_| bad_number())?;
        let shift = scale
            .pow10
            .checked_add(9)
            .and_then(|s| s.checked_sub(frac_len))
            .ok_or_else(|| overflow(input))?;
        let magnitude = shift_to_integer(&digits, shift).ok_or_else(|| overflow(input))?;
        let nanos = if negative { -magnitude } else { magnitude };
        Ok(Quantity {
            nanos,
            format: scale.format,
        })
    }
}

fn overflow(input: &str) -> QuantityError {
    QuantityError::Overflow {
        input: input.to_string(),
    }
}

/// What a suffix multiplies by: 10^pow10 * 2^pow2.
struct Scale {
    pow10: i64,
    pow2: u32,
    format: Format,
}

fn parse_suffix(input: &str, suffix: &str) -> Result<Scale, QuantityError> {
    let decimal = |pow10| Scale {
        pow10,
        pow2: 0,
        format: Format::DecimalSi,
    };
    let binary = |pow2| Scale {
        pow10: 0,
        pow2,
        format: Format::BinarySi,
    };
    let scale = match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .and_then(parse_exponent)
                .ok_or_else(|| QuantityError::BadSuffix {
                    input: input.to_string(),
                    suffix: suffix.to_string(),
                })?;
            Scale {
                pow10: exponent,
                pow2: 0,
                format: Format::DecimalExponent,
            }
        }
    };
    Ok(scale)
}

/// A signed integer exponent. Exponents beyond ±10^15 cannot describe a representable value
/// anyway, so they are clamped instead of rejected here; the shift then rounds or overflows.
fn parse_exponent(text: &str) -> Option<i64> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    const LIMIT: i64 = 1_000_000_000_000_000;
    let magnitude = digits.parse::<i64>().unwrap_or(LIMIT).min(LIMIT);
    Some(if negative { -magnitude } else { magnitude })
}

/// Multiplies a big-endian decimal digit string by 2^pow2 in place (pow2 <= 60).
fn multiply_digits(digits: &mut Vec<u8>, pow2: u32) {
    if pow2 == 0 {
        return;
    }
    let factor: u128 = 1u128 << pow2;
    let mut carry: u128 = 0;
    for d in digits.iter_mut().rev() {
        let v = u128::from(*d) * factor + carry;
        *d = (v % 10) as u8;
        carry = v / 10;
    }
    let mut head = Vec::new();
    while carry > 0 {
        head.push((carry % 10) as u8);
        carry /= 10;
    }
    head.reverse();
    head.append(digits);
    *digits = head;
}

/// The integer `digits * 10^shift`, rounded up when `shift` drops non-zero digits; `None` when
/// it does not fit an `i128`.
fn shift_to_integer(digits: &[u8], shift: i64) -> Option<i128> {
    let first_nonzero = digits.iter().position(|&d| d != 0);
    let Some(start) = first_nonzero else {
        return Some(0);
    };
    let significant = &digits[start..];
    let len = i64::try_from(significant.len()).ok()?;
    // Integer part: the leading `len + shift` digits (padded with zeros when shift > 0).
    let kept_len = len.checked_add(shift)?;
    if kept_len > 39 {
        return None;
    }
    let kept_len = usize::try_from(kept_len.max(0)).ok()?;
    let mut value: i128 = 0;
    for i in 0..kept_len {
        let d = significant.get(i).copied().unwrap_or(0);
        value = value.checked_mul(10)?.checked_add(i128::from(d))?;
    }
    let dropped_nonzero = significant.iter().skip(kept_len).any(|&d| d != 0);
    if dropped_nonzero {
        value = value.checked_add(1)?;
    }
    Some(value)
}

// ---------------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------------

impl fmt::Display for Quantity {
    /// Kubernetes' canonical form: binary quantities use the largest exact binary suffix (whole
    /// values of at least 1024 only, otherwise decimal SI); decimal quantities use the largest
    /// power of 1000 that keeps the mantissa an integer (`1500m`, `4k`, `12e6`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let magnitude = self.nanos.unsigned_abs();
        let nanos = NANOS as u128;
        if self.format == Format::BinarySi
            && magnitude.is_multiple_of(nanos)
            && magnitude / nanos >= 1024
        {
            let (mantissa, suffix) = binary_mantissa(magnitude / nanos);
            return write!(f, "{sign}{mantissa}{suffix}");
        }
        let (mantissa, exponent) = decimal_mantissa(magnitude);
        if self.format == Format::DecimalExponent {
            if exponent == 0 {
                write!(f, "{sign}{mantissa}")
            } else {
                write!(f, "{sign}{mantissa}e{exponent}")
            }
        } else {
            write!(f, "{sign}{mantissa}{}", decimal_suffix(exponent))
        }
    }
}

fn binary_mantissa(mut units: u128) -> (u128, &'static str) {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut index = 0;
    while index + 1 < SUFFIXES.len() && units.is_multiple_of(1024) {
        units /= 1024;
        index += 1;
    }
    (units, SUFFIXES.get(index).copied().unwrap_or(""))
}

/// Mantissa and base-10 exponent (a multiple of 3 in -9..=18) of a non-zero nano magnitude.
fn decimal_mantissa(mut nanos: u128) -> (u128, i32) {
    let mut exponent = -9;
    while exponent < 18 && nanos.is_multiple_of(1000) {
        nanos /= 1000;
        exponent += 3;
    }
    (nanos, exponent)
}

fn decimal_suffix(exponent: i32) -> &'static str {
    match exponent {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => "",
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison, operators, conversions
// ---------------------------------------------------------------------------------------------

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

/// Saturating; see [`Quantity::saturating_add`].
impl std::ops::Add for Quantity {
    type Output = Quantity;
    fn add(self, rhs: Quantity) -> Quantity {
        self.saturating_add(rhs)
    }
}

/// Saturating; see [`Quantity::saturating_sub`].
impl std::ops::Sub for Quantity {
    type Output = Quantity;
    fn sub(self, rhs: Quantity) -> Quantity {
        self.saturating_sub(rhs)
    }
}

impl std::iter::Sum for Quantity {
    fn sum<I: Iterator<Item = Quantity>>(iter: I) -> Quantity {
        iter.fold(Quantity::ZERO, Quantity::saturating_add)
    }
}

impl TryFrom<&K8sQuantity> for Quantity {
    type Error = QuantityError;
    fn try_from(q: &K8sQuantity) -> Result<Self, Self::Error> {
        Quantity::from_k8s(q)
    }
}

impl From<Quantity> for K8sQuantity {
    fn from(q: Quantity) -> Self {
        q.to_k8s()
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    /// Accepts a string or a JSON number (Kubernetes quantities are int-or-string).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        quantity_from_json(&value).map_err(serde::de::Error::custom)
    }
}

/// A quantity from JSON that may be a string or a number, as `x-kubernetes-int-or-string`
/// fields are.
pub fn quantity_from_json(value: &serde_json::Value) -> Result<Quantity, QuantityError> {
    match value {
        serde_json::Value::String(s) => s.parse(),
        serde_json::Value::Number(n) => n.to_string().parse(),
        other => Err(QuantityError::BadNumber {
            input: other.to_string(),
        }),
    }
}

impl schemars::JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        <K8sQuantity as schemars::JsonSchema>::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <K8sQuantity as schemars::JsonSchema>::json_schema(generator)
    }
}

// ---------------------------------------------------------------------------------------------
// Resource lists
// ---------------------------------------------------------------------------------------------

/// A resource list entry that is not a valid quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resource {key:?}: {source}")]
pub struct ResourcesError {
    pub key: String,
    #[source]
    pub source: QuantityError,
}

/// A Kubernetes ResourceList (`cpu`, `memory`, `pods`, extended resources...) with exact values.
/// A missing key means zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Resources(pub BTreeMap<String, Quantity>);

impl schemars::JsonSchema for Resources {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ResourceList".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <BTreeMap<String, Quantity> as schemars::JsonSchema>::json_schema(generator)
    }
}

impl Resources {
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `key`, zero when absent.
    pub fn get(&self, key: &str) -> Quantity {
        self.0.get(key).copied().unwrap_or(Quantity::ZERO)
    }

    pub fn set(&mut self, key: impl Into<String>, value: Quantity) {
        self.0.insert(key.into(), value);
    }

    /// Builder form of [`Resources::set`].
    pub fn with(mut self, key: impl Into<String>, value: Quantity) -> Self {
        self.set(key, value);
        self
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Quantity)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Key-wise sum (saturating); keys of either side appear in the result.
    pub fn add(&self, other: &Resources) -> Resources {
        let mut out = self.clone();
        out.add_assign(other);
        out
    }

    /// In-place form of [`Resources::add`].
    pub fn add_assign(&mut self, other: &Resources) {
        for (key, value) in &other.0 {
            let entry = self.0.entry(key.clone()).or_insert(Quantity::ZERO);
            *entry = entry.saturating_add(*value);
        }
    }

    /// Key-wise difference (saturating). Results may be negative, which is how "over capacity"
    /// shows up when computing what is left.
    pub fn sub(&self, other: &Resources) -> Resources {
        let mut out = self.clone();
        for (key, value) in &other.0 {
            let entry = out.0.entry(key.clone()).or_insert(Quantity::ZERO);
            *entry = entry.saturating_sub(*value);
        }
        out
    }

    /// True when every requested quantity is at most the capacity's (missing capacity = 0).
    pub fn fits(&self, capacity: &Resources) -> bool {
        self.0.iter().all(|(key, want)| *want <= capacity.get(key))
    }

    /// The keys whose request exceeds `capacity`, for messages that say what did not fit.
    pub fn exceeding(&self, capacity: &Resources) -> Vec<String> {
        self.0
            .iter()
            .filter(|(key, want)| **want > capacity.get(key))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Key-wise maximum.
    pub fn max_with(&self, other: &Resources) -> Resources {
        let mut out = self.clone();
        for (key, value) in &other.0 {
            let entry = out.0.entry(key.clone()).or_insert(*value);
            if *value > *entry {
                *entry = *value;
            }
        }
        out
    }

    /// True when every value is zero (an empty list is zero).
    pub fn is_zero(&self) -> bool {
        self.0.values().all(Quantity::is_zero)
    }

    /// From a Kubernetes resource list (a Node's `BTreeMap`, a claim's `ResourceList`).
    pub fn from_k8s<'a>(
        list: impl IntoIterator<Item = (&'a String, &'a K8sQuantity)>,
    ) -> Result<Resources, ResourcesError> {
        list.into_iter()
            .map(|(key, q)| {
                Quantity::from_k8s(q)
                    .map(|v| (key.clone(), v))
                    .map_err(|source| ResourcesError {
                        key: key.clone(),
                        source,
                    })
            })
            .collect::<Result<BTreeMap<_, _>, _>>()
            .map(Resources)
    }

    /// As a Kubernetes resource list (a `BTreeMap`, or a claim's `ResourceList`).
    pub fn to_k8s<L: FromIterator<(String, K8sQuantity)>>(&self) -> L {
        self.0
            .iter()
            .map(|(k, v)| (k.clone(), v.to_k8s()))
            .collect()
    }
}

impl FromIterator<(String, Quantity)> for Resources {
    fn from_iter<I: IntoIterator<Item = (String, Quantity)>>(iter: I) -> Self {
        Resources(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests;
