//! Label and field selectors as kube-apiserver parses them from query strings, and the
//! LabelSelector object form (matchLabels / matchExpressions) used by PodDisruptionBudgets.

use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<LabelReq>,
    /// A LabelSelector object with an operator we do not know matches nothing, as in Kubernetes.
    nothing: bool,
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_term(term)?);
        }
        Ok(Self {
            reqs,
            nothing: false,
        })
    }

    /// From a metav1 LabelSelector object; `None` (absent) selects nothing, `{}` selects everything.
    pub fn from_object(selector: Option<&Value>) -> Result<Self, String> {
        let Some(sel) = selector.and_then(Value::as_object) else {
            return Ok(Self {
                reqs: Vec::new(),
                nothing: true,
            });
        };
        let mut reqs = Vec::new();
        if let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                reqs.push(LabelReq::Eq(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        let exprs = sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (i, e) in exprs.iter().enumerate() {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|vs| {
                    vs.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            let op = e
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default();
            reqs.push(match op {
                "In" => LabelReq::In(key, values),
                "NotIn" => LabelReq::NotIn(key, values),
                "Exists" => LabelReq::Exists(key),
                "DoesNotExist" => LabelReq::NotExists(key),
                other => {
                    return Err(format!(
                        "matchExpressions[{i}].operator: {other:?} is not a valid operator"
                    ));
                }
            });
        }
        Ok(Self {
            reqs,
            nothing: false,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty() && !self.nothing
    }

    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        if self.nothing {
            return false;
        }
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }

    /// Matches an object by its `metadata.labels`.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(obj.pointer("/metadata/labels").and_then(Value::as_object))
    }
}

/// Splits on commas outside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_term(term: &str) -> Result<LabelReq, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(LabelReq::NotExists(valid_key(key.trim())?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(LabelReq::NotEq(valid_key(k.trim())?, v.trim().to_string()));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(LabelReq::Eq(valid_key(k.trim())?, v.trim().to_string()));
    }
    for (word, notin) in [(" notin ", true), (" in ", false)] {
        if let Some((k, rest)) = term.split_once(word) {
            let rest = rest.trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| {
                    format!("unable to parse requirement: {term:?}: values must be in parentheses")
                })?;
            let values: Vec<String> = inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            let key = valid_key(k.trim())?;
            return Ok(if notin {
                LabelReq::NotIn(key, values)
            } else {
                LabelReq::In(key, values)
            });
        }
    }
    if term.contains(char::is_whitespace) || term.contains(['(', ')', '<', '>']) {
        return Err(format!("unable to parse requirement: {term:?}"));
    }
    Ok(LabelReq::Exists(valid_key(term)?))
}

fn valid_key(k: &str) -> Result<String, String> {
    if k.is_empty() || k.contains(char::is_whitespace) {
        return Err(format!(
            "unable to parse requirement: invalid label key {k:?}"
        ));
    }
    Ok(k.to_string())
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, comma separated.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses and checks every field against the ones the resource supports (400 otherwise).
    pub fn parse(s: &str, supported: &[String]) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let field = field.trim();
            let known = field == "metadata.name" || field == "metadata.namespace";
            if !known && !supported.iter().any(|f| f == field) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(Self { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The same selector over fields stored elsewhere (`to_stored` maps a field to its path).
    pub fn map_fields(mut self, to_stored: impl Fn(&str) -> String) -> Self {
        for (field, _, _) in &mut self.terms {
            *field = to_stored(field);
        }
        self
    }

    /// Missing fields read as "", so `spec.nodeName=` selects unbound pods as in Kubernetes.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms
            .iter()
            .all(|(field, eq, value)| (field_value(obj, field) == *value) == *eq)
    }
}

/// An object's `spec.selector.matchLabels` as a label-selector query (`k=v,...`), as workload
/// controllers and the scale subresource report it; empty when there is none.
pub fn match_labels_query(obj: &Value) -> String {
    obj.pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn field_value(obj: &Value, field: &str) -> String {
    let mut cur = obj;
    for part in field.split('.') {
        match cur.get(part) {
            Some(next) => cur = next,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn every_operator() {
        let l = labels(json!({"a": "1", "b": "2"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&l));
        assert!(m("a=1") && m("a==1") && !m("a=2"));
        assert!(m("a!=2") && !m("a!=1") && m("zz!=1"));
        assert!(m("a in (1, 3)") && !m("a in (3)") && !m("zz in (1)"));
        assert!(m("a notin (3)") && !m("a notin (1,2)") && m("zz notin (1)"));
        assert!(m("a") && !m("zz") && m("!zz") && !m("!a"));
        assert!(m("a=1,b in (2),!c") && !m("a=1,b=3"));
        assert!(m(""));
        assert!(LabelSelector::parse("a in 1").is_err());
    }

    #[test]
    fn object_form() {
        let sel = json!({"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]});
        let s = LabelSelector::from_object(Some(&sel)).unwrap();
        assert!(s.matches(Some(&labels(json!({"app": "x"})))));
        assert!(!s.matches(Some(&labels(json!({"app": "x", "t": "a"})))));
        assert!(!LabelSelector::from_object(None).unwrap().matches(None));
        assert!(
            LabelSelector::from_object(Some(&json!({})))
                .unwrap()
                .matches(None)
        );
    }

    #[test]
    fn fields() {
        let supported = vec!["spec.nodeName".to_string()];
        let pod = json!({"metadata": {"name": "p"}, "spec": {}});
        assert!(
            FieldSelector::parse("spec.nodeName=", &supported)
                .unwrap()
                .matches(&pod)
        );
        assert!(
            FieldSelector::parse("spec.nodeName!=n1,metadata.name==p", &supported)
                .unwrap()
                .matches(&pod)
        );
        assert!(
            !FieldSelector::parse("metadata.name=q", &supported)
                .unwrap()
                .matches(&pod)
        );
        assert!(FieldSelector::parse("spec.other=x", &supported).is_err());
    }
}
