//! Label selectors as Cluster API objects carry them (a MachineDeployment's `spec.selector`, a
//! ClusterAPINodeClass's selection), read from either API version's JSON or from a typed
//! `LabelSelector`, and matched against a label map.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::capi::json::{ModelError, Reader};

/// `In`, `NotIn`, `Exists`, `DoesNotExist` of a label selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SelectorRequirement {
    pub(crate) key: String,
    pub operator: SelectorOperator,
    pub(crate) values: Vec<String>,
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`, ANDed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<SelectorRequirement>,
}

impl LabelSelector {
    /// True when `labels` satisfy every term. An empty selector matches everything.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let labels_match = self
            .match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        labels_match
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::NotIn => !value.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }

    /// The selector in the API's query syntax (`a=b,c in (d,e),!f`), for list and watch calls.
    pub fn to_query(&self) -> String {
        let mut terms: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for r in &self.match_expressions {
            terms.push(match r.operator {
                SelectorOperator::In => format!("{} in ({})", r.key, r.values.join(",")),
                SelectorOperator::NotIn => format!("{} notin ({})", r.key, r.values.join(",")),
                SelectorOperator::Exists => r.key.clone(),
                SelectorOperator::DoesNotExist => format!("!{}", r.key),
            });
        }
        terms.join(",")
    }

    pub(super) fn read(reader: &Reader<'_>, path: &str) -> Result<LabelSelector, ModelError> {
        let match_labels = reader.string_map(&format!("{path}.matchLabels"))?;
        let mut match_expressions = Vec::new();
        let list_path = format!("{path}.matchExpressions");
        for (i, item) in reader.array(&list_path)?.iter().enumerate() {
            let field = |name: &str| format!("{list_path}[{i}].{name}");
            let key = reader
                .member_str(item, &field("key"))?
                .ok_or_else(|| reader.missing(&field("key")))?;
            let op_text = reader
                .member_str(item, &field("operator"))?
                .ok_or_else(|| reader.missing(&field("operator")))?;
            let operator = match op_text.as_str() {
                "In" => SelectorOperator::In,
                "NotIn" => SelectorOperator::NotIn,
                "Exists" => SelectorOperator::Exists,
                "DoesNotExist" => SelectorOperator::DoesNotExist,
                other => {
                    return Err(
                        reader.invalid(&field("operator"), format!("unknown operator {other:?}"))
                    );
                }
            };
            let values = match item.get("values") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(vs)) => vs
                    .iter()
                    .enumerate()
                    .map(|(j, v)| {
                        v.as_str().map(str::to_string).ok_or_else(|| {
                            reader.wrong(&field(&format!("values[{j}]")), "a string")
                        })
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(reader.wrong(&field("values"), "a list of strings")),
            };
            let needs_values = matches!(operator, SelectorOperator::In | SelectorOperator::NotIn);
            if needs_values == values.is_empty() {
                let why = if needs_values {
                    format!("operator {op_text} needs at least one value")
                } else {
                    format!("operator {op_text} takes no values")
                };
                return Err(reader.invalid(&field("values"), why));
            }
            match_expressions.push(SelectorRequirement {
                key,
                operator,
                values,
            });
        }
        Ok(LabelSelector {
            match_labels,
            match_expressions,
        })
    }
}

/// A core LabelSelector (e.g. a ClusterAPINodeClass's `spec.scalableResourceSelector`) in the
/// model's form; a bad operator or value count is an error naming the expression.
impl TryFrom<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> for LabelSelector {
    type Error = String;

    fn try_from(
        s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<Self, String> {
        let mut match_expressions = Vec::new();
        for (i, e) in s.match_expressions.iter().flatten().enumerate() {
            let operator = match e.operator.as_str() {
                "In" => SelectorOperator::In,
                "NotIn" => SelectorOperator::NotIn,
                "Exists" => SelectorOperator::Exists,
                "DoesNotExist" => SelectorOperator::DoesNotExist,
                other => {
                    return Err(format!(
                        "matchExpressions[{i}].operator: unknown operator {other:?}"
                    ));
                }
            };
            let values = e.values.clone().unwrap_or_default();
            let needs_values = matches!(operator, SelectorOperator::In | SelectorOperator::NotIn);
            if needs_values == values.is_empty() {
                return Err(format!(
                    "matchExpressions[{i}].values: operator {} {}",
                    e.operator,
                    if needs_values {
                        "needs at least one value"
                    } else {
                        "takes no values"
                    }
                ));
            }
            match_expressions.push(SelectorRequirement {
                key: e.key.clone(),
                operator,
                values,
            });
        }
        Ok(LabelSelector {
            match_labels: s.match_labels.clone().unwrap_or_default(),
            match_expressions,
        })
    }
}
