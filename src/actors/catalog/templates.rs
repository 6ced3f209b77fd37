//! The Catalog's reads of infrastructure templates: when each MachineDeployment's (or
//! MachinePool's) template is due to be read, and what an answer changes. A template that
//! cannot be read leaves the annotations in charge (or the last capacity read); one that does
//! not exist keeps its group out; one with no answer yet keeps it unknown.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::Catalog;
use crate::actors::backoff::Backoff;
use crate::capi::model::MachineDeployment;
use crate::capi::template::{ReadError, TemplateCapacity, read_template};

/// A MachineDeployment that changed re-reads its template at most this often: templates are
/// small, but a scale-up changes a MachineDeployment's status many times a second.
const TEMPLATE_REREAD_MIN: Duration = Duration::from_secs(5);

/// A MachinePool's infrastructure pool is re-read at least this often: an edit of it in place
/// (its instances' drift) need not change the MachinePool.
const POOL_REREAD: Duration = Duration::from_secs(30);

/// What we last read of one MachineDeployment's infrastructure template.
pub(super) struct TemplateRead {
    /// The reference it was read through (group/version/kind/name).
    ref_id: String,
    /// The MachineDeployment's resourceVersion when it was read (re-read when it changes).
    md_version: String,
    read_at: Instant,
    pub(super) capacity: TemplateCapacity,
    /// Set while reads fail: when to try again (a transient error is never cached for good).
    retry_at: Option<Instant>,
    /// The last read found no such template (`Kind namespace/name not found`).
    pub(super) missing: Option<String>,
    /// The last read failed otherwise, with the error; cleared by a read that succeeds.
    pub(super) error: Option<String>,
    /// Some read of this reference succeeded, so `capacity` is what the template said.
    pub(super) read_ok: bool,
    backoff: Backoff,
}

/// What the catalog's build needs of the template reads, by MachineDeployment key.
pub(super) struct TemplateViews {
    pub(crate) capacity: HashMap<String, TemplateCapacity>,
    pub(crate) missing: HashMap<String, String>,
    /// Groups whose template has no answer yet: unknown, never taken for gone.
    pub(crate) unread: HashSet<String>,
    pub(crate) failing: HashMap<String, String>,
}

/// One read that was started: what it was about, so its answer can be recorded.
struct Asked {
    key: String,
    ref_id: String,
    md_version: String,
    is_pool: bool,
}

/// What is known of one MachineDeployment's template apart from the read itself: what came
/// before an answer, then (updated by it) what the answer leaves.
struct Before {
    capacity: TemplateCapacity,
    read_ok: bool,
    backoff: Backoff,
    /// The reference is the one just read (otherwise everything before is forgotten).
    same_ref: bool,
    missing: Option<String>,
    error: Option<String>,
}

/// The reference a template is read through, as one string.
fn ref_id(md: &MachineDeployment) -> String {
    let r = &md.infrastructure_ref;
    format!(
        "{}/{}/{}/{}",
        r.api_group,
        r.version.clone().unwrap_or_default(),
        r.kind,
        r.name
    )
}

impl Catalog {
    /// The template reads as the build sees them, for these MachineDeployments.
    pub(super) fn template_views(&self, mds: &[Arc<MachineDeployment>]) -> TemplateViews {
        let t = &self.templates;
        TemplateViews {
            capacity: t
                .iter()
                .map(|(k, t)| (k.clone(), t.capacity.clone()))
                .collect(),
            missing: t
                .iter()
                .filter_map(|(k, t)| Some((k.clone(), t.missing.clone()?)))
                .collect(),
            unread: mds
                .iter()
                .map(|md| md.key())
                .filter(|k| !t.contains_key(k))
                .collect(),
            failing: t
                .iter()
                .filter(|(_, t)| !t.read_ok)
                .filter_map(|(k, t)| Some((k.clone(), t.error.clone()?)))
                .collect(),
        }
    }

    /// Read each MachineDeployment's infrastructure template: first when it appears, again
    /// when its reference changes, when the MachineDeployment changes (a provider fills a
    /// template's status.capacity after the fact; at most every TEMPLATE_REREAD_MIN), a
    /// MachinePool's infrastructure pool also every POOL_REREAD, and, while reads fail, after
    /// a backoff. Entries of MachineDeployments that are gone go.
    pub(super) fn fetch_missing_templates(
        &mut self,
        mds: &[Arc<MachineDeployment>],
        ctx: &mut Context<Self>,
    ) {
        let live: HashSet<String> = mds.iter().map(|md| md.key()).collect();
        self.templates.retain(|k, _| live.contains(k));
        let now = Instant::now();
        let mut next_due: Option<Instant> = None;
        for md in mds {
            let Some(due) = self.template_due(md, now) else {
                continue;
            };
            if due > now {
                next_due = Some(next_due.map_or(due, |n| n.min(due)));
            } else if self.fetching.insert(md.key()) {
                self.read_template_of(md, ctx);
            }
        }
        if let Some(due) = next_due
            && !self.reread_scheduled
        {
            self.reread_scheduled = true;
            ctx.run_later(due.saturating_duration_since(now), |act, ctx| {
                act.reread_scheduled = false;
                act.schedule_rebuild(ctx);
            });
        }
    }

    /// When this MachineDeployment's template is next due to be read (`None`: not until
    /// something changes).
    fn template_due(&self, md: &MachineDeployment, now: Instant) -> Option<Instant> {
        match self.templates.get(&md.key()) {
            None => Some(now),
            Some(t) if t.ref_id != ref_id(md) => Some(now),
            Some(t) => match t.retry_at {
                Some(at) => Some(at),
                None if t.md_version != md.resource_version => {
                    Some(t.read_at + TEMPLATE_REREAD_MIN)
                }
                None if md.is_pool() => Some(t.read_at + POOL_REREAD),
                None => None,
            },
        }
    }

    /// Starts one read; its answer is recorded on the actor.
    fn read_template_of(&mut self, md: &MachineDeployment, ctx: &mut Context<Self>) {
        let r = &md.infrastructure_ref;
        let client = self.shared.management.clone();
        let (group, kind, name, ns) = (
            r.api_group.clone(),
            r.kind.clone(),
            r.name.clone(),
            md.namespace.clone(),
        );
        let pinned = r.version.clone();
        let asked = Asked {
            key: md.key(),
            ref_id: ref_id(md),
            md_version: md.resource_version.clone(),
            is_pool: md.is_pool(),
        };
        let fut = async move { read_template(&client, &group, pinned, &kind, &ns, &name).await };
        ctx.spawn(fut.into_actor(self).map(move |answer, act, ctx| {
            act.fetching.remove(&asked.key);
            let before = act.forget_read(&asked);
            match answer {
                Ok(capacity) => act.template_read(asked, before, capacity, ctx),
                Err(e) => act.template_failed(asked, before, e, ctx),
            }
        }));
    }

    /// Takes the last read of `asked`'s MachineDeployment out, keeping of it only what still
    /// holds for the reference just read.
    fn forget_read(&mut self, asked: &Asked) -> Before {
        let previous = self.templates.remove(&asked.key);
        let same_ref = previous.as_ref().is_some_and(|p| p.ref_id == asked.ref_id);
        match previous {
            Some(p) if same_ref => Before {
                capacity: p.capacity,
                read_ok: p.read_ok,
                backoff: p.backoff,
                same_ref,
                missing: p.missing,
                error: p.error,
            },
            _ => Before {
                capacity: TemplateCapacity::default(),
                read_ok: false,
                backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(120)),
                same_ref: false,
                missing: None,
                error: None,
            },
        }
    }

    /// Keeps what is now known of `asked`'s template.
    fn store(&mut self, asked: Asked, now: Before, retry_at: Option<Instant>) {
        self.templates.insert(
            asked.key,
            TemplateRead {
                ref_id: asked.ref_id,
                md_version: asked.md_version,
                read_at: Instant::now(),
                capacity: now.capacity,
                retry_at,
                missing: now.missing,
                error: now.error,
                read_ok: now.read_ok,
                backoff: now.backoff,
            },
        );
    }

    /// A template read: its capacity stands; the catalog is rebuilt if that is news.
    fn template_read(
        &mut self,
        asked: Asked,
        mut before: Before,
        capacity: TemplateCapacity,
        ctx: &mut Context<Self>,
    ) {
        // An infrastructure pool that has not said yet whether it has MachinePool Machines
        // keeps its MachinePool out of the catalog: read it again soon rather than when the
        // pool next changes.
        let undecided = asked.is_pool && capacity.machine_kind.is_none() && !capacity.provisioned;
        let retry_at = if undecided {
            let d = before.backoff.next_delay();
            ctx.run_later(d, |act, ctx| act.schedule_rebuild(ctx));
            Some(Instant::now() + d)
        } else {
            before.backoff.reset();
            None
        };
        let changed = !before.same_ref
            || capacity != before.capacity
            || before.missing.is_some()
            || !before.read_ok;
        before.capacity = capacity;
        before.missing = None;
        before.error = None;
        before.read_ok = true;
        self.store(asked, before, retry_at);
        if changed {
            self.schedule_rebuild(ctx);
        }
    }

    /// A read that failed: a template that does not exist is reported and its MachineDeployment
    /// not offered; any other failure may pass, so the annotations (or the last capacity read)
    /// stand meanwhile. Either way it is read again after a backoff.
    fn template_failed(
        &mut self,
        asked: Asked,
        mut before: Before,
        e: ReadError,
        ctx: &mut Context<Self>,
    ) {
        let delay = before.backoff.next_delay();
        let key = &asked.key;
        let missing = matches!(e, ReadError::NotFound { .. }).then(|| e.to_string());
        if missing.is_some() {
            tracing::warn!(machine_deployment = %key, error = %e, retry_in = ?delay, "infrastructure template not found; not offering the MachineDeployment");
        } else {
            tracing::debug!(machine_deployment = %key, error = %e, retry_in = ?delay, "infrastructure template not readable; using annotations (or the last capacity read) and retrying");
        }
        let error = missing.is_none().then(|| e.to_string());
        // The first answer, or a change of what is wrong, is news to the catalog.
        let changed = missing != before.missing || error != before.error || !before.same_ref;
        before.missing = missing;
        before.error = error;
        self.store(asked, before, Some(Instant::now() + delay));
        if changed {
            self.schedule_rebuild(ctx);
        }
        ctx.run_later(delay, |act, ctx| act.schedule_rebuild(ctx));
    }
}
