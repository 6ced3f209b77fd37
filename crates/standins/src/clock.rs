//! The simulated API server's wall clock, as Kubernetes writes timestamps (whole seconds, UTC).
//! Below the store and managed fields, which both stamp times.

pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
