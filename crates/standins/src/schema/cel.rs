//! A CRD's CEL rules (`x-kubernetes-validations`), evaluated with cel-rust plus the Kubernetes
//! library functions the rules use that it lacks. `self` is the value the rule sits on, `oldSelf`
//! the stored one; a rule that names `oldSelf` is a transition rule, checked only on an update
//! that has an old value to compare with.

use std::sync::{Arc, OnceLock};

use cel::extractors::This;
use cel::objects::{Key, Map};
use cel::{Context, Env, ExecutionError, Program};
use serde_json::Value;

use super::Cause;
use super::fields::{join, shown};

/// Functions a rule may call: cel-rust's standard library and macros, and the Kubernetes
/// library functions added here. A rule calling anything else fails to compile, so that a CRD
/// with a rule this evaluator cannot run is refused at registration instead of passing
/// everything.
const FUNCTIONS: &[&str] = &[
    "size",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "dyn",
    "type",
    // Kubernetes' regex library.
    "find",
    // Kubernetes' quantity library, as far as CRDs here use it (CapacityQuota's limits).
    "quantity",
    "isInteger",
];

/// One compiled rule.
pub struct Rule {
    source: String,
    program: Program,
    message: Option<String>,
    message_expression: Option<Program>,
    reason: &'static str,
    field_path: Option<String>,
    transition: bool,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule").field("rule", &self.source).finish()
    }
}

fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib()))
}

impl Rule {
    /// Compiles one entry of `x-kubernetes-validations`.
    pub fn compile(spec: &Value) -> Result<Self, String> {
        let source = spec
            .get("rule")
            .and_then(Value::as_str)
            .ok_or("a validation without a rule")?
            .to_string();
        let program = compile(&source)?;
        let message_expression = spec
            .get("messageExpression")
            .and_then(Value::as_str)
            .map(compile)
            .transpose()?;
        let reason = match spec.get("reason").and_then(Value::as_str) {
            None | Some("FieldValueInvalid") => "FieldValueInvalid",
            Some("FieldValueForbidden") => "FieldValueForbidden",
            Some("FieldValueRequired") => "FieldValueRequired",
            Some("FieldValueDuplicate") => "FieldValueDuplicate",
            Some(other) => return Err(format!("rule {source:?}: unknown reason {other:?}")),
        };
        let transition = program.references().has_variable("oldSelf");
        Ok(Self {
            message: spec
                .get("message")
                .and_then(Value::as_str)
                .map(String::from),
            field_path: spec
                .get("fieldPath")
                .and_then(Value::as_str)
                .map(|p| p.trim_start_matches('.').to_string()),
            source,
            program,
            message_expression,
            reason,
            transition,
        })
    }

    /// Evaluates the rule on `v` (at `path`), `old` being the stored value on an update.
    pub fn check(&self, v: &Value, old: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
        if self.transition && old.is_none() {
            return;
        }
        let mut ctx = context();
        ctx.add_variable_from_value("self", to_cel(v));
        if let Some(old) = old {
            ctx.add_variable_from_value("oldSelf", to_cel(old));
        }
        // kube-apiserver quotes a scalar it refuses, not a map or a list, unless the rule
        // failed to evaluate.
        let quoted = |why: String| match v {
            Value::Object(_) | Value::Array(_) => why,
            _ => format!("{}: {why}", shown(v)),
        };
        let why = match self.program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => return,
            Ok(cel::Value::Bool(false)) => quoted(self.message(&ctx)),
            Ok(other) => format!("{}: rule evaluated to {other:?}, not a bool", shown(v)),
            Err(e) => format!("{}: {e} evaluating rule: {}", shown(v), self.message(&ctx)),
        };
        let field = match &self.field_path {
            Some(p) => join(path, p),
            None => path.to_string(),
        };
        causes.push(Cause {
            reason: self.reason,
            field,
            message: format!("Invalid value: {why}"),
        });
    }

    fn message(&self, ctx: &Context) -> String {
        if let Some(m) = &self.message_expression
            && let Ok(cel::Value::String(s)) = m.execute(ctx)
        {
            return s.to_string();
        }
        match &self.message {
            Some(m) => m.clone(),
            None => format!("failed rule: {}", self.source),
        }
    }
}

fn compile(source: &str) -> Result<Program, String> {
    let program = env()
        .compile(source)
        .map_err(|e| format!("rule {source:?} does not compile: {e}"))?;
    let references = program.references();
    let unknown: Vec<&str> = references
        .functions()
        .into_iter()
        .filter(|f| f.starts_with(char::is_alphabetic) && !FUNCTIONS.contains(f))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "rule {source:?} calls {unknown:?}, which the simulated server cannot evaluate"
        ));
    }
    Ok(program)
}

/// A context with the Kubernetes library functions cel-rust lacks.
fn context() -> Context<'static, 'static> {
    let mut ctx = Context::with_env(env().clone());
    // Names the standard library does not declare cannot conflict.
    let _ = ctx.add_function("find", find);
    let _ = ctx.add_function("quantity", quantity);
    let _ = ctx.add_function("isInteger", is_integer);
    ctx
}

/// Kubernetes' `<string>.find(<regex>)`: the first match, or `""`.
fn find(This(this): This<Arc<String>>, re: Arc<String>) -> Result<cel::Value, ExecutionError> {
    let re = regex::Regex::new(&re).map_err(|e| ExecutionError::function_error("find", e))?;
    Ok(re
        .find(&this)
        .map(|m| m.as_str().to_string())
        .unwrap_or_default()
        .into())
}

/// `quantity(s)`: the quantity `s` (kept as its string, which `isInteger` reads); an error for a
/// string that is not one, as Kubernetes'.
fn quantity(s: Arc<String>) -> Result<cel::Value, ExecutionError> {
    parse_quantity("quantity", &s)?;
    Ok(cel::Value::String(s))
}

/// `q.isInteger()`: the quantity is a whole number. A milli quantity never is (Kubernetes keeps
/// it at scale -3, which does not convert to an integer without a rescale it does not do).
fn is_integer(This(this): This<Arc<String>>) -> Result<cel::Value, ExecutionError> {
    let milli_units = parse_quantity("isInteger", &this)?;
    let milli = this.trim_end().ends_with('m');
    Ok(cel::Value::Bool(!milli && milli_units % 1000 == 0))
}

/// `s` in thousandths (rounded up, so a fraction finer than that is not whole), or the CEL
/// error `function` raises for a string that is not a quantity.
fn parse_quantity(function: &str, s: &str) -> Result<i128, ExecutionError> {
    crate::quantity::parse_milli(s)
        .ok_or_else(|| ExecutionError::function_error(function, format!("{s:?} is not a quantity")))
}

/// A JSON value as CEL sees it: integers as `int`, other numbers as `double`.
fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(m) => cel::Value::Map(Map {
            map: Arc::new(
                m.iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                    .collect(),
            ),
        }),
    }
}
