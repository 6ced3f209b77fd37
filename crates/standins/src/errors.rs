//! Errors of the simulated API server: `ApiError` is what a request fails with (it renders as a
//! metav1 `Status` body, as kube-apiserver's do); `SimError` is what starting the server fails with.

use serde_json::{Value, json};

/// A request failure, rendered as a metav1 `Status` object with the HTTP code in `code`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": group, "kind": kind}));
        self
    }

    /// `nodeclaims.karpenter.sh "x" not found`
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", group_resource(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// A path that names no served resource.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!(
                "{} \"{name}\" already exists",
                group_resource(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    /// The optimistic-concurrency failure kube-apiserver returns for a stale resourceVersion.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict_with(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict_with(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                group_resource(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422, as kube-apiserver answers a failed validation or a JSON patch that cannot be applied.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 422 Invalid with one cause per field, as kube-apiserver answers a write that fails
    /// validation: `Kind.group "name" is invalid: field: message` (several in brackets).
    pub fn invalid_fields(
        group: &str,
        kind: &str,
        name: &str,
        causes: &[(&'static str, String, String)],
    ) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let listed: Vec<String> = causes
            .iter()
            .map(|(_, field, message)| format!("{field}: {message}"))
            .collect();
        let all = match listed.as_slice() {
            [one] => one.clone(),
            _ => format!("[{}]", listed.join(", ")),
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{qualified} {name:?} is invalid: {all}"),
        );
        let causes: Vec<Value> = causes
            .iter()
            .map(|(reason, field, message)| {
                json!({"reason": reason, "message": message, "field": field})
            })
            .collect();
        e.details = Some(json!({"name": name, "group": group, "kind": kind, "causes": causes}));
        e
    }

    /// 410 Expired: a watch or continue token older than the retained history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn too_many_requests(message: impl Into<String>, causes: Value) -> Self {
        let mut e = Self::new(429, "TooManyRequests", message);
        e.details = Some(json!({"causes": causes}));
        e
    }

    /// 429 asking the client to come back after `seconds` (`details.retryAfterSeconds`, sent
    /// as the `Retry-After` header too), as API Priority and Fairness answers.
    pub fn throttled(seconds: u64) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "too many requests, please try again later",
        );
        e.details = Some(json!({"retryAfterSeconds": seconds}));
        e
    }

    /// The `Retry-After` a response with this error carries (kube-apiserver sets the header
    /// from `details.retryAfterSeconds`).
    pub fn retry_after(&self) -> Option<u64> {
        self.details
            .as_ref()?
            .get("retryAfterSeconds")?
            .as_u64()
            .filter(|s| *s > 0)
    }

    /// 504, as kube-apiserver answers a request that did not finish in time (it may still
    /// have been applied).
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The metav1 Status body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".into(), details.clone());
        }
        status
    }
}

/// `plural.group`, or just `plural` for the core group, as kube-apiserver names resources in messages.
pub fn group_resource(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// Why the simulated server could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulated API server: cannot bind 127.0.0.1: {0}")]
    Bind(std::io::Error),
    #[error("simulated API server: cannot start its runtime thread: {0}")]
    Runtime(std::io::Error),
    #[error("simulated API server: cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        source: std::io::Error,
    },
    #[error("simulated API server: extra resource {0}: {1}")]
    Registry(String, String),
    #[error("simulated API server: server thread exited before it was ready")]
    NotReady,
}
