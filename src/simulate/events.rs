//! Events as a user reads them: listed through the API (events.k8s.io/v1, what kube's recorder
//! writes), not from the store, so the real control plane's scenarios read them alike (its
//! store mirror does not watch Events).

use kube::core::{ApiResource, DynamicObject};
use serde_json::Value;

use super::{BackgroundSim, Error};

/// Every `events.k8s.io/v1` Event, as JSON.
pub async fn all(client: kube::Client) -> Result<Vec<Value>, kube::Error> {
    let ar = ApiResource {
        group: "events.k8s.io".into(),
        version: "v1".into(),
        api_version: "events.k8s.io/v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
    };
    let api: kube::Api<DynamicObject> = kube::Api::all_with(client, &ar);
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|e| serde_json::to_value(e).ok())
        .collect())
}

/// Every Event of `reason`, read on the simulated cluster's runtime.
pub async fn with_reason(sim: &BackgroundSim, reason: &str) -> Result<Vec<Value>, Error> {
    let reason = reason.to_string();
    let mut events = sim
        .run(move |c| async move { all(c.client()).await })
        .await?
        .map_err(|source| Error::Kube {
            what: "listing Events".into(),
            source,
        })?;
    events.retain(|e| e["reason"] == reason.as_str());
    Ok(events)
}
