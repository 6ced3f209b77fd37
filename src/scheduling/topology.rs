//! Topology spread and pod (anti-)affinity: matching pods counted per domain, and the
//! decision whether a pod may join a node or claim, narrowing an open claim to one domain.
//!
//! Counts are kept per group (pods sharing a term share one group), so a check costs a few
//! map lookups, never a scan over the pods already placed.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::pod::{GroupKey, TermKind};
use crate::api::requirements::Requirements;
use crate::api::wellknown::HOSTNAME_LABEL;

#[derive(Debug)]
struct Group {
    key: GroupKey,
    /// Matching pods per domain.
    counts: HashMap<String, u32>,
    total: u32,
    /// For anti-affinity: pods *carrying* the term per domain, which repel matching pods
    /// (anti-affinity is symmetric).
    owners: HashMap<String, u32>,
    owners_total: u32,
}

/// Where a pod is being tried.
pub enum Place<'a> {
    /// An existing or in-flight node: every domain is known.
    Node {
        labels: &'a BTreeMap<String, String>,
        hostname: &'a str,
    },
    /// A claim of this round: its hostname is its own; other keys may still be open.
    Claim {
        hostname: &'a str,
        requirements: &'a Requirements,
    },
}

/// The domains a place may take for one key.
enum View<'p> {
    Fixed(Option<Cow<'p, str>>),
    Open(Vec<&'p str>),
}

/// All topology groups of one solve.
#[derive(Debug, Default)]
pub struct Topology {
    groups: Vec<Group>,
    index: HashMap<GroupKey, usize>,
    /// Known domains per topology key (zones of offerings, labels of existing nodes).
    universe: HashMap<String, BTreeSet<String>>,
}

impl Topology {
    pub fn intern(&mut self, key: &GroupKey) -> usize {
        if let Some(i) = self.index.get(key) {
            return *i;
        }
        let i = self.groups.len();
        self.groups.push(Group {
            key: key.clone(),
            counts: HashMap::new(),
            total: 0,
            owners: HashMap::new(),
            owners_total: 0,
        });
        self.index.insert(key.clone(), i);
        i
    }

    /// The topology keys in use (to collect their domains).
    pub fn keys(&self) -> BTreeSet<String> {
        self.groups
            .iter()
            .map(|g| g.key.topology_key.clone())
            .collect()
    }

    pub fn add_domain(&mut self, key: &str, value: &str) {
        self.universe
            .entry(key.to_string())
            .or_default()
            .insert(value.to_string());
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The groups whose selector matches a pod with these labels in this namespace.
    pub fn matching(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Vec<usize> {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.key.namespaces.contains(namespace) && g.key.selector.matches(labels))
            .map(|(i, _)| i)
            .collect()
    }

    /// Counts a pod placed at a place: in every group it matches, and as an owner of its
    /// anti-affinity groups. `domain(key)` gives the place's value for a key, if known.
    pub fn record<'d>(
        &mut self,
        matched: &[usize],
        owned: &[usize],
        domain: impl Fn(&str) -> Option<&'d str>,
    ) {
        for &gi in matched {
            if let Some(g) = self.groups.get_mut(gi)
                && let Some(d) = domain(&g.key.topology_key)
            {
                *g.counts.entry(d.to_string()).or_insert(0) += 1;
                g.total += 1;
            }
        }
        for &gi in owned {
            if let Some(g) = self.groups.get_mut(gi)
                && g.key.kind == TermKind::AntiAffinity
                && let Some(d) = domain(&g.key.topology_key)
            {
                *g.owners.entry(d.to_string()).or_insert(0) += 1;
                g.owners_total += 1;
            }
        }
    }

    pub fn kind(&self, group: usize) -> Option<TermKind> {
        self.groups.get(group).map(|g| g.key.kind)
    }

    /// Whether a pod may go to `place` given its active terms (`active`), the groups it matches
    /// (`matched`) and its node requirements. On success, the (key, value) narrowings an open
    /// claim must take; on failure, why not.
    pub fn admit(
        &self,
        active: &[usize],
        matched: &[usize],
        pod_reqs: &Requirements,
        place: &Place,
    ) -> Result<Vec<(String, String)>, String> {
        let mut narrowed: Vec<(String, String)> = Vec::new();
        for &gi in active {
            let Some(g) = self.groups.get(gi) else {
                continue;
            };
            let key = g.key.topology_key.as_str();
            let view = self.view(key, place, pod_reqs, &narrowed);
            let count = |d: &str| g.counts.get(d).copied().unwrap_or(0);
            let self_match = matched.contains(&gi);
            let chosen = match g.key.kind {
                TermKind::Spread {
                    max_skew,
                    min_domains,
                } => {
                    let min = self.global_min(g, pod_reqs, min_domains);
                    let allowed = |d: &str| i64::from(count(d)) + 1 - min <= i64::from(max_skew);
                    match view {
                        View::Fixed(Some(d)) if allowed(&d) => None,
                        View::Fixed(_) => {
                            return Err(format!(
                                "topology spread on {key:?} (maxSkew {max_skew}) would be violated"
                            ));
                        }
                        View::Open(ds) => ds
                            .into_iter()
                            .filter(|d| allowed(d))
                            .min_by_key(|d| count(d))
                            .map(Some)
                            .ok_or_else(|| {
                                format!("topology spread on {key:?} (maxSkew {max_skew}) leaves no domain")
                            })?,
                    }
                }
                TermKind::Affinity => {
                    // The first pod of a self-affine group may start anywhere.
                    let anywhere = g.total == 0 && self_match;
                    match view {
                        View::Fixed(_) if anywhere => None,
                        View::Fixed(Some(d)) if count(&d) > 0 => None,
                        View::Fixed(_) => {
                            return Err(format!("pod affinity on {key:?} not satisfied here"));
                        }
                        View::Open(ds) => {
                            let best = if anywhere {
                                ds.into_iter().next()
                            } else {
                                ds.into_iter()
                                    .filter(|d| count(d) > 0)
                                    .max_by(|a, b| count(a).cmp(&count(b)).then(b.cmp(a)))
                            };
                            Some(best.ok_or_else(|| {
                                format!("pod affinity on {key:?}: no domain holds a matching pod")
                            })?)
                        }
                    }
                }
                TermKind::AntiAffinity => match view {
                    View::Fixed(Some(d)) if count(&d) > 0 => {
                        return Err(format!(
                            "pod anti-affinity on {key:?}: a matching pod is already in {d:?}"
                        ));
                    }
                    View::Fixed(_) => None,
                    View::Open(ds) => {
                        Some(ds.into_iter().find(|d| count(d) == 0).ok_or_else(|| {
                            format!(
                                "pod anti-affinity on {key:?}: every domain holds a matching pod"
                            )
                        })?)
                    }
                },
            };
            // Only an open claim is narrowed; a fixed place already has its domain.
            if let Some(d) = chosen {
                narrowed.push((key.to_string(), d.to_string()));
            }
        }
        self.check_inverse_anti_affinity(matched, pod_reqs, place, &mut narrowed)?;
        Ok(narrowed)
    }

    /// Pods already placed with anti-affinity terms that match this pod keep it out of their
    /// domains.
    fn check_inverse_anti_affinity(
        &self,
        matched: &[usize],
        pod_reqs: &Requirements,
        place: &Place,
        narrowed: &mut Vec<(String, String)>,
    ) -> Result<(), String> {
        for &gi in matched {
            let Some(g) = self.groups.get(gi) else {
                continue;
            };
            if g.key.kind != TermKind::AntiAffinity || g.owners_total == 0 {
                continue;
            }
            let key = g.key.topology_key.as_str();
            let owners = |d: &str| g.owners.get(d).copied().unwrap_or(0);
            match self.view(key, place, pod_reqs, narrowed) {
                View::Fixed(Some(d)) if owners(&d) > 0 => {
                    return Err(format!(
                        "a pod in {d:?} has anti-affinity on {key:?} against this pod"
                    ));
                }
                View::Fixed(_) => {}
                View::Open(ds) => {
                    let d = ds.into_iter().find(|d| owners(d) == 0).ok_or_else(|| {
                        format!("pods with anti-affinity on {key:?} against this pod are in every domain")
                    })?;
                    narrowed.push((key.to_string(), d.to_string()));
                }
            }
        }
        Ok(())
    }

    /// The smallest count over the domains the pod could use (0 for hostnames, where a new node
    /// is always a new, empty domain, and when fewer than minDomains domains exist).
    fn global_min(&self, g: &Group, pod_reqs: &Requirements, min_domains: i32) -> i64 {
        let key = g.key.topology_key.as_str();
        if key == HOSTNAME_LABEL {
            return 0;
        }
        let allowed = pod_reqs.get(key);
        let eligible = self
            .universe
            .get(key)
            .into_iter()
            .flatten()
            .filter(|d| allowed.is_none_or(|r| r.has(d)));
        let mut n = 0usize;
        let mut min = u32::MAX;
        for d in eligible {
            n += 1;
            min = min.min(g.counts.get(d.as_str()).copied().unwrap_or(0));
        }
        if n == 0 || n < usize::try_from(min_domains).unwrap_or(1) {
            return 0;
        }
        i64::from(min)
    }

    fn view<'p>(
        &'p self,
        key: &str,
        place: &Place<'p>,
        pod_reqs: &Requirements,
        narrowed: &[(String, String)],
    ) -> View<'p> {
        if let Some((_, v)) = narrowed.iter().find(|(k, _)| k == key) {
            return View::Fixed(Some(Cow::Owned(v.clone())));
        }
        match place {
            Place::Node { labels, hostname } => {
                if key == HOSTNAME_LABEL {
                    let h = labels.get(key).map(String::as_str).unwrap_or(hostname);
                    return View::Fixed(Some(Cow::Borrowed(h)));
                }
                View::Fixed(labels.get(key).map(|v| Cow::Borrowed(v.as_str())))
            }
            Place::Claim {
                hostname,
                requirements,
            } => {
                if key == HOSTNAME_LABEL {
                    return View::Fixed(Some(Cow::Borrowed(hostname)));
                }
                if let Some(vs) = requirements.values(key)
                    && vs.len() == 1
                {
                    return View::Fixed(vs.iter().next().map(|v| Cow::Borrowed(v.as_str())));
                }
                let theirs = requirements.get(key);
                let mine = pod_reqs.get(key);
                View::Open(
                    self.universe
                        .get(key)
                        .into_iter()
                        .flatten()
                        .filter(|d| theirs.is_none_or(|r| r.has(d)))
                        .filter(|d| mine.is_none_or(|r| r.has(d)))
                        .map(String::as_str)
                        .collect(),
                )
            }
        }
    }
}
