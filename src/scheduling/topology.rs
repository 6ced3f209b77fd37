//! Topology spread and pod (anti-)affinity: matching pods counted per domain, and the
//! decision whether a pod may join a node or claim, narrowing an open claim to the domains it may
//! still take (one for a spread or affinity, every free one for anti-affinity: upstream's late
//! committal).
//!
//! Counts are kept per group (pods sharing a term share one group), so a check costs a few
//! map lookups, never a scan over the pods already placed.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Taint;

use super::pod::{GroupKey, PodInfo, TermKind};
use super::selector::tolerates;
use crate::api::requirements::Requirements;
use crate::api::wellknown::{EPHEMERAL_TAINT_KEYS, HOSTNAME_LABEL};

#[derive(Debug)]
struct Group {
    key: GroupKey,
    /// For a spread that honours node affinity or taints: the pod whose term made the group
    /// (its node-selector terms and tolerations decide which nodes its pods count on).
    filter: Option<PodInfo>,
    /// Matching pods per domain.
    counts: HashMap<String, u32>,
    total: u32,
    /// For anti-affinity: pods *carrying* the term per domain, which repel matching pods
    /// (anti-affinity is symmetric).
    owners: HashMap<String, u32>,
    owners_total: u32,
}

/// Where a pod is being tried.
pub(crate) enum Place<'a> {
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

/// An open claim's narrowing for one topology key: the values it may still take.
pub(crate) type Narrowing = (String, Values);

/// The values a narrowing leaves: one (a spread or affinity picks its domain; kept apart so the
/// common case allocates no list) or several (every free domain of an anti-affinity).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Values {
    One(String),
    Many(Vec<String>),
}

impl Values {
    pub(crate) fn as_slice(&self) -> &[String] {
        match self {
            Values::One(v) => std::slice::from_ref(v),
            Values::Many(vs) => vs,
        }
    }
}

/// The free domains (`taken` is zero) of an open view: no narrowing when every domain is free,
/// `Err` when none is.
fn free_of(
    key: &str,
    open: Vec<&str>,
    taken: impl Fn(&str) -> u32,
) -> Result<Option<Narrowing>, ()> {
    // Counted before anything is allocated: this runs for every claim an anti-affine pod is
    // tried against, and most answers are "every domain free" or "none".
    let free = open.iter().filter(|d| taken(d) == 0).count();
    match free {
        0 => Err(()),
        n if n == open.len() => Ok(None),
        _ => Ok(Some((
            key.to_string(),
            Values::Many(
                open.into_iter()
                    .filter(|d| taken(d) == 0)
                    .map(str::to_string)
                    .collect(),
            ),
        ))),
    }
}

/// Why a place was refused. Built in the solver's inner loop, where almost every refusal is
/// discarded, so it holds only the group; [`Topology::explain`] words it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    SpreadViolated(usize),
    SpreadNoDomain(usize),
    AffinityHere(usize),
    AffinityNoDomain(usize),
    AntiAffinityHere(usize),
    AntiAffinityEverywhere(usize),
    RepelledHere(usize),
    RepelledEverywhere(usize),
}

/// The domains of one topology key a placed pod may be in: one, decided (a node's label, a
/// claim narrowed to one value), or every value a claim still allows (empty when it allows any,
/// or when the caller did not ask for them: only anti-affinity records an open claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Domains<'d> {
    One(&'d str),
    Open(Vec<&'d str>),
}

impl<'d> Domains<'d> {
    pub(crate) fn from_one(d: Option<&'d str>) -> Self {
        d.map_or(Domains::Open(Vec::new()), Domains::One)
    }

    fn into_vec(self) -> Vec<&'d str> {
        match self {
            Domains::One(d) => vec![d],
            Domains::Open(all) => all,
        }
    }
}

/// One more pod in each of `domains`, and in the group's total when it is in any.
fn count_in(counts: &mut HashMap<String, u32>, total: &mut u32, domains: Domains<'_>) {
    let domains = domains.into_vec();
    for d in &domains {
        *counts.entry((*d).to_string()).or_insert(0) += 1;
    }
    if !domains.is_empty() {
        *total += 1;
    }
}

/// What offers a domain: a NodePool (through its instance types or requirements) or an
/// existing node. A spread's node filter (nodeAffinityPolicy, nodeTaintsPolicy) decides which
/// of them count.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'a> {
    Pool {
        taints: &'a [Taint],
    },
    Node {
        labels: &'a BTreeMap<String, String>,
        taints: &'a [Taint],
    },
    /// A claim of this solve: its requirements must be compatible with one of the pod's terms.
    Claim {
        requirements: &'a Requirements,
        taints: &'a [Taint],
    },
}

impl Group {
    /// Whether a pod placed at `place` counts in this group: always, except for a spread whose
    /// node filter the place fails (upstream's TopologyGroup.Counts).
    fn counts_at(&self, place: &Source) -> bool {
        let (
            Some(pod),
            TermKind::Spread {
                honor_affinity,
                honor_taints,
                ..
            },
        ) = (&self.filter, self.key.kind)
        else {
            return true;
        };
        place.passes(pod, honor_affinity, honor_taints)
    }
}

impl Source<'_> {
    /// Whether a node of this source passes the filter of a spread carried by `pod`, as
    /// upstream's TopologyNodeFilter decides: with `honor_affinity` an existing node must
    /// match one of the pod's node-selector terms (NodePools are narrowed by the pod's
    /// requirements instead), with `honor_taints` the pod must tolerate the taints.
    fn passes(&self, pod: &PodInfo, honor_affinity: bool, honor_taints: bool) -> bool {
        let affinity_ok = !honor_affinity
            || match self {
                Source::Pool { .. } => true,
                Source::Node { labels, .. } => {
                    pod.node_terms.iter().any(|t| t.matches_labels(labels))
                }
                Source::Claim { requirements, .. } => pod
                    .node_terms
                    .iter()
                    .any(|t| requirements.compatible(t).is_ok()),
            };
        let taints = match self {
            Source::Pool { taints }
            | Source::Node { taints, .. }
            | Source::Claim { taints, .. } => *taints,
        };
        let taints_ok = !honor_taints
            || taints.iter().all(|t| {
                EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str())
                    || t.effect == "PreferNoSchedule"
                    || tolerates(&pod.tolerations, t)
            });
        affinity_ok && taints_ok
    }
}

/// All topology groups of one solve.
#[derive(Debug, Default)]
pub(crate) struct Topology<'a> {
    groups: Vec<Group>,
    index: HashMap<GroupKey, usize>,
    /// Known domains per topology key (zones of offerings, labels of existing nodes), each
    /// with what offers it (for the node filters of spreads).
    universe: HashMap<String, BTreeMap<String, Vec<Source<'a>>>>,
    /// Labels per Namespace name, for namespace selectors of affinity terms.
    namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl<'a> Topology<'a> {
    /// The group of a term `pod` carries.
    pub(crate) fn intern(&mut self, key: &GroupKey, pod: &PodInfo) -> usize {
        if let Some(i) = self.index.get(key) {
            return *i;
        }
        let filtered = matches!(
            key.kind,
            TermKind::Spread {
                honor_affinity: true,
                ..
            } | TermKind::Spread {
                honor_taints: true,
                ..
            }
        );
        let i = self.groups.len();
        self.groups.push(Group {
            filter: filtered.then(|| pod.clone()),
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
    pub(crate) fn keys(&self) -> BTreeSet<String> {
        self.groups
            .iter()
            .map(|g| g.key.topology_key.clone())
            .collect()
    }

    /// Registers a domain offered by a node or NodePool.
    pub(crate) fn add_domain(&mut self, key: &str, value: &str, source: Source<'a>) {
        self.universe
            .entry(key.to_string())
            .or_default()
            .entry(value.to_string())
            .or_default()
            .push(source);
    }

    /// No groups yet; `namespace_labels` (Namespace name to labels) serve the
    /// `namespaceSelector`s of affinity terms.
    pub(crate) fn with_namespaces(
        namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    ) -> Self {
        Topology {
            namespace_labels,
            ..Topology::default()
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The groups whose selector matches a pod with these labels in this namespace.
    pub(crate) fn matching(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<usize> {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, g)| {
                g.key
                    .namespaces
                    .contains(namespace, |n| self.namespace_labels.get(n))
                    && g.key.selector.matches(labels)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Counts a pod placed at a place: in every group it matches (a spread only when the place
    /// passes its node filter), and as an owner of its anti-affinity groups. `domain(key)` gives
    /// the place's value for a key, if known; `place` is what the node filter checks.
    pub(crate) fn record<'d>(
        &mut self,
        matched: &[usize],
        owned: &[usize],
        domains: impl Fn(&str, bool) -> Domains<'d>,
        place: Source,
    ) {
        for &gi in matched {
            let Some(g) = self.groups.get_mut(gi) else {
                continue;
            };
            if !g.counts_at(&place) {
                continue;
            }
            // Anti-affinity blocks every domain the pod may still land in (upstream's
            // "Schrödinger" pods); affinity and spread count only a decided domain.
            let anti = g.key.kind == TermKind::AntiAffinity;
            let at = domains(&g.key.topology_key, anti);
            count_in(&mut g.counts, &mut g.total, at);
        }
        for &gi in owned {
            let Some(g) = self.groups.get_mut(gi) else {
                continue;
            };
            if g.key.kind != TermKind::AntiAffinity {
                continue;
            }
            let at = domains(&g.key.topology_key, true);
            count_in(&mut g.owners, &mut g.owners_total, at);
        }
    }

    pub(crate) fn kind(&self, group: usize) -> Option<TermKind> {
        self.groups.get(group).map(|g| g.key.kind)
    }

    /// Whether a pod may go to `place` given its active terms (`active`), the groups it matches
    /// (`matched`), its node requirements (`pod_reqs`, preferences being tried included) and its
    /// required ones alone (`strict`, which bound a spread's global minimum). On success, the
    /// narrowings an open claim must take (key and the values left); on failure, why not.
    pub(crate) fn admit(
        &self,
        active: &[usize],
        matched: &[usize],
        pod_reqs: &Requirements,
        strict: &Requirements,
        pod: &PodInfo,
        place: &Place,
    ) -> Result<Vec<Narrowing>, Rejection> {
        let mut narrowed: Vec<Narrowing> = Vec::new();
        for &gi in active {
            let Some(g) = self.groups.get(gi) else {
                continue;
            };
            let key = g.key.topology_key.as_str();
            let view = self.view(key, place, pod_reqs, &narrowed);
            let count = |d: &str| g.counts.get(d).copied().unwrap_or(0);
            let self_match = matched.contains(&gi);
            let chosen = match g.key.kind {
                TermKind::Spread { max_skew, .. } => {
                    let min = self.global_min(g, strict, pod);
                    let allowed = |d: &str| spread_allows(count(d), min, max_skew);
                    match view {
                        View::Fixed(Some(d)) if allowed(&d) => None,
                        View::Fixed(_) => return Err(Rejection::SpreadViolated(gi)),
                        View::Open(ds) => ds
                            .into_iter()
                            .filter(|d| allowed(d))
                            .min_by_key(|d| count(d))
                            .map(|d| Some((key.to_string(), Values::One(d.to_string()))))
                            .ok_or(Rejection::SpreadNoDomain(gi))?,
                    }
                }
                TermKind::Affinity => {
                    // A self-affine pod may start anywhere when no matching pod is in a domain
                    // its own (required) node requirements allow: the first of its group, or
                    // one whose group-mates all sit where it may not go (upstream's
                    // nextDomainAffinity).
                    let mine = strict.get(key);
                    let anywhere = self_match
                        && (g.total == 0
                            || !g
                                .counts
                                .iter()
                                .any(|(d, n)| *n > 0 && mine.is_none_or(|r| r.has(d))));
                    match view {
                        View::Fixed(_) if anywhere => None,
                        View::Fixed(Some(d)) if count(&d) > 0 => None,
                        View::Fixed(_) => return Err(Rejection::AffinityHere(gi)),
                        View::Open(ds) => {
                            let best = if anywhere {
                                ds.into_iter().next()
                            } else {
                                ds.into_iter()
                                    .filter(|d| count(d) > 0)
                                    .max_by(|a, b| count(a).cmp(&count(b)).then(b.cmp(a)))
                            };
                            let d = best.ok_or(Rejection::AffinityNoDomain(gi))?;
                            Some((key.to_string(), Values::One(d.to_string())))
                        }
                    }
                }
                TermKind::AntiAffinity => match view {
                    View::Fixed(Some(d)) if count(&d) > 0 => {
                        return Err(Rejection::AntiAffinityHere(gi));
                    }
                    View::Fixed(_) => None,
                    // Late committal: the claim keeps every free domain open, and the pod's
                    // anti-affinity is recorded over all of them.
                    View::Open(ds) => free_of(key, ds, count)
                        .map_err(|()| Rejection::AntiAffinityEverywhere(gi))?,
                },
            };
            // Only an open claim is narrowed; a fixed place already has its domain.
            if let Some(n) = chosen {
                narrowed.push(n);
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
        narrowed: &mut Vec<Narrowing>,
    ) -> Result<(), Rejection> {
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
                View::Fixed(Some(d)) if owners(&d) > 0 => return Err(Rejection::RepelledHere(gi)),
                View::Fixed(_) => {}
                View::Open(ds) => {
                    if let Some(n) =
                        free_of(key, ds, owners).map_err(|()| Rejection::RepelledEverywhere(gi))?
                    {
                        narrowed.push(n);
                    }
                }
            }
        }
        Ok(())
    }

    /// The words for a refusal (only the refusals that decide a pod's error are worded).
    pub(crate) fn explain(&self, rejection: Rejection) -> String {
        use Rejection::*;
        let (AffinityHere(gi)
        | AffinityNoDomain(gi)
        | AntiAffinityHere(gi)
        | AntiAffinityEverywhere(gi)
        | RepelledHere(gi)
        | RepelledEverywhere(gi)
        | SpreadViolated(gi)
        | SpreadNoDomain(gi)) = rejection;
        let Some(g) = self.groups.get(gi) else {
            return "topology constraint not satisfied".into();
        };
        let key = &g.key.topology_key;
        let skew = match g.key.kind {
            TermKind::Spread { max_skew, .. } => max_skew,
            _ => 0,
        };
        match rejection {
            SpreadViolated(_) => {
                format!("topology spread on {key:?} (maxSkew {skew}) would be violated")
            }
            SpreadNoDomain(_) => {
                format!("topology spread on {key:?} (maxSkew {skew}) leaves no domain")
            }
            AffinityHere(_) => format!("pod affinity on {key:?} not satisfied here"),
            AffinityNoDomain(_) => {
                format!("pod affinity on {key:?}: no domain holds a matching pod")
            }
            AntiAffinityHere(_) => {
                format!("pod anti-affinity on {key:?}: a matching pod is already in this domain")
            }
            AntiAffinityEverywhere(_) => {
                format!("pod anti-affinity on {key:?}: every domain holds a matching pod")
            }
            RepelledHere(_) => {
                format!("a pod in this domain has anti-affinity on {key:?} against this pod")
            }
            RepelledEverywhere(_) => {
                format!("pods with anti-affinity on {key:?} against this pod are in every domain")
            }
        }
    }

    /// Whether a group is keyed by hostname in a way that can rule a place out for good: a
    /// hostname spread or anti-affinity. Counts per hostname only grow within a solve, so a
    /// claim such a group refuses stays refused (the solver indexes these).
    pub(crate) fn host_keyed(&self, group: usize) -> bool {
        self.groups.get(group).is_some_and(|g| {
            g.key.topology_key == HOSTNAME_LABEL
                && matches!(g.key.kind, TermKind::Spread { .. } | TermKind::AntiAffinity)
        })
    }

    /// For a [`Self::host_keyed`] group and a place with this hostname: (the place refuses pods
    /// carrying the term, the place repels pods the term matches). Exactly the hostname checks
    /// of [`Self::admit`]: a spread at its skew (the global minimum of a hostname spread is
    /// always 0), a matching pod for anti-affinity, an owner of required anti-affinity.
    pub(crate) fn host_blocks(&self, group: usize, hostname: &str) -> (bool, bool) {
        let Some(g) = self.groups.get(group) else {
            return (false, false);
        };
        let count = g.counts.get(hostname).copied().unwrap_or(0);
        match g.key.kind {
            TermKind::Spread { max_skew, .. } => (!spread_allows(count, 0, max_skew), false),
            TermKind::AntiAffinity => (count > 0, g.owners.get(hostname).copied().unwrap_or(0) > 0),
            TermKind::Affinity => (false, false),
        }
    }

    /// The smallest count over the domains the pod could use (0 for hostnames, where a new node
    /// is always a new, empty domain, and when fewer than minDomains domains exist). Which
    /// domains count: those the pod's requirements allow, offered by a node or NodePool that
    /// passes the spread's node filter ([`Source::passes`]).
    fn global_min(&self, g: &Group, pod_reqs: &Requirements, pod: &PodInfo) -> i64 {
        let key = g.key.topology_key.as_str();
        let TermKind::Spread {
            min_domains,
            honor_affinity,
            honor_taints,
            ..
        } = g.key.kind
        else {
            return 0;
        };
        if key == HOSTNAME_LABEL {
            return 0;
        }
        let allowed = pod_reqs.get(key);
        let filtered = honor_affinity || honor_taints;
        let offered = |sources: &Vec<Source>| {
            !filtered
                || sources
                    .iter()
                    .any(|s| s.passes(pod, honor_affinity, honor_taints))
        };
        let eligible = self
            .universe
            .get(key)
            .into_iter()
            .flatten()
            .filter(|(d, sources)| allowed.is_none_or(|r| r.has(d)) && offered(sources))
            .map(|(d, _)| d);
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
        narrowed: &[Narrowing],
    ) -> View<'p> {
        // Each narrowing of a key was made from the view of the ones before it: the last is the
        // narrowest.
        let narrow = narrowed
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v);
        if let Some([one]) = narrow.map(Values::as_slice) {
            return View::Fixed(Some(Cow::Owned(one.clone())));
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
                        .flat_map(BTreeMap::keys)
                        .filter(|d| theirs.is_none_or(|r| r.has(d)))
                        .filter(|d| mine.is_none_or(|r| r.has(d)))
                        .filter(|d| narrow.is_none_or(|n| n.as_slice().contains(d)))
                        .map(String::as_str)
                        .collect(),
                )
            }
        }
    }
}

/// A spread allows one more pod in a domain holding `count` while the emptiest eligible domain
/// holds `min`.
fn spread_allows(count: u32, min: i64, max_skew: i32) -> bool {
    i64::from(count) + 1 - min <= i64::from(max_skew)
}
