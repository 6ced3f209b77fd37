#!/usr/bin/env python3
"""Where the controller's CPU went, from scripts/profile-controller.sh's OUT.perf.txt files, for
docs/benchmarks.md ("Where the controller's CPU goes on a real control plane").

Usage: scripts/profile-buckets.py [--hz 499] NAME=OUT.perf.txt:CLAIMS ...
  e.g. scripts/profile-buckets.py sim=prof/sim-burst.perf.txt:1000 real=prof/real-burst.perf.txt:1000

Only the controller's threads count: every thread not named `sim*` or `cpu-meter`, as
`cpu_ms.controller` counts them. Every sample is one period of the sampling clock (1/hz s of
CPU). For each run it prints, in CPU milliseconds per claim:
- buckets: each sample goes to the first frame, from the leaf up, that names a known part (TLS,
  HTTP, JSON decoding, ...); frames of the standard library, hashbrown, memcpy and the like are
  passed over, so a memcpy inside serde counts as JSON decoding. jemalloc is a bucket of its
  own, except below the compact forms (state::compact, state::trim, the pod index), whose JSON
  round trips count with them;
- handlers: the outermost controller frame of each sample (the actor handler or pass that the
  work was for); samples without one are the connections and watch streams that tokio polls
  directly, split by their bucket;
- the top self symbols.
Samples below the simulate harness (invariant checks, teardown: simulate:: or sim:: frames other
than the controller's start) are left out; `cpu_ms.controller` counts the harness work done
before the report is measured, so the totals here are slightly below it.
"""

import collections
import re
import sys

ALLOC = re.compile(
    r'(_rjem_|^je_|tikv_jemalloc|__rust_alloc|__rust_dealloc|__rust_realloc|__rdl_|^malloc$|^free$'
    r'|^realloc$|^calloc$|^arena_|^tcache_|^pac_|^extent_|^emap_|^sec_|^hpa_|^large_|^thread_tcache'
    r'|^ecache_|^eset_|^bin_|^psset_|^base_|^pages_|^sz_|alloc::alloc::exchange_malloc)')
TLS = re.compile(
    r'(rustls|(?<![A-Za-z_])ring::|ring_core_|webpki|_nistz256|x25519|^fe_|^bn_|aes_hw|aesni|^gcm_'
    r'|GFp_|ChaCha|sha256_block|sha512_block|^limbs_|^ecp_|^p256_|^p384_|^LIMBS_|^CRYPTO_|^aes_)')
HTTP = re.compile(
    r'(hyper::|hyper_util::|httparse|\bhttp::|^<http::|h2::|http_body|tower::|tower_http'
    r'|tokio_util::codec|kube_client::client::body|kube_client::client::builder'
    r'|kube_client::client::middleware)')
DEC = re.compile(
    r'(serde_json::de|serde_json::read|serde_json::value::de|serde::de::|serde_core::de::'
    r'|Deserialize|deserialize|visit_map|visit_seq|serde_path_to_error|karpenter_capi::api::decode)')
ENC = re.compile(
    r'(serde_json::ser|serde_json::value::ser|(?<![Dd]e)Serialize>::serialize|(?<![Dd]e)serialize_'
    r'|json_patch|jsonptr|serde_core::ser|serde_json::value::to_value|serde_json::to_)')
PATCH_CONTEXT = re.compile(r'(json_patch|jsonptr|serde_json::ser|serde_json::value::ser|to_value)')
COMPACT_CONTEXT = re.compile(
    r'karpenter_capi::state::(compact|trim|pods::Entry::pod|pods::Pods::apply)')
STATE = re.compile(r'karpenter_capi::state::')
SOLVE = re.compile(
    r'(karpenter_capi::scheduling|karpenter_capi::actors::provisioner|karpenter_capi::disruption'
    r'|karpenter_capi::view|karpenter_capi::capi::offerings)')
WATCH = re.compile(r'(kube_runtime::|kube_client::api::.*watch|request_events)')
RUNTIME = re.compile(
    r'(^actix|<actix|actix::|tokio::|^<tokio|futures_util|futures_core|futures_channel|mio::'
    r'|parking_lot|crossbeam)')
OURS = re.compile(r'karpenter_capi::')
LOGS = re.compile(r'(tracing|prometheus_client)')
GENERIC = re.compile(
    r'^(core::|alloc::|std::|hashbrown::|<core::|<alloc::|<std::|<hashbrown|<&|<str |<\[|__mem|memcpy'
    r'|memmove|memset|memcmp|\[unknown\]|<T as|<bytes::|bytes::|smallvec|indexmap|<indexmap'
    r'|<smallvec|__strlen|<\(|_start|__libc|clone3|start_thread|<Vec|<String|<Box|<u8|<char|<usize'
    r'|<i64|<u64|<f64|<bool|<Option|<Result|drop_in_place|<jiff|jiff::)')
HARNESS = re.compile(
    r'(karpenter_capi::simulate::(?!start_controller)|karpenter_capi::sim::'
    r'|drop_in_place<actix_rt::system::SystemRunner>)')

KERNEL = '[kernel.kallsyms]'
B_TLS = 'TLS (rustls, ring)'
B_HTTP = 'HTTP/1.1 (hyper, http, tower)'
B_DEC = 'JSON decoding (serde_json, k8s-openapi)'
B_ENC = 'JSON encoding, patches (serde_json::ser, json_patch)'
B_COMPACT = 'compact forms: trim, build, read back'
B_STATE = 'indexes (state::)'
B_SOLVE = 'solver, disruption, views'
B_WATCH = 'watcher (kube_runtime)'
B_RUNTIME = 'actor and runtime bookkeeping (actix, tokio, futures)'
B_ALLOC = 'allocation (jemalloc, with its madvise)'
B_KERNEL = 'kernel (sockets, epoll, scheduling)'
B_LOGS = 'logging, metrics'
B_OURS = 'other controller code'
B_OTHER = 'other'
ORDER = [B_TLS, B_HTTP, B_DEC, B_ENC, B_COMPACT, B_STATE, B_SOLVE, B_WATCH, B_RUNTIME, B_ALLOC,
         B_KERNEL, B_LOGS, B_OURS, B_OTHER]


def parse(path):
    """Samples of `perf script -F comm,tid,time,period,ip,sym,dso`: frames leaf first."""
    samples, cur = [], None
    for line in open(path, errors='replace'):
        if not line.strip():
            if cur:
                samples.append(cur)
            cur = None
        elif not line[0].isspace():
            parts = line.split()
            cur = {'comm': parts[0], 'frames': []}
        elif cur is not None:
            m = re.match(r'\s*[0-9a-f]+\s+(.*)\s+\((.*)\)\s*$', line)
            if m:
                sym = re.sub(r'\+0x[0-9a-f]+$', '', m.group(1).strip()).replace(' (inlined)', '')
                cur['frames'].append((sym, m.group(2)))
    if cur:
        samples.append(cur)
    return [s for s in samples
            if not s['comm'].startswith(('sim', 'cpu-meter'))
            and not any(HARNESS.search(f) for f, _ in s['frames'])]


def first_bucket(frames):
    kernel_leaf = bool(frames) and frames[0][1] == KERNEL
    for sym, dso in frames:
        if dso == KERNEL:
            continue
        if ALLOC.search(sym):
            return B_ALLOC
        if kernel_leaf:
            return B_KERNEL
        if TLS.search(sym):
            return B_TLS
        if HTTP.search(sym):
            return B_HTTP
        if ENC.search(sym):
            return B_ENC
        if DEC.search(sym):
            if any(PATCH_CONTEXT.search(f) for f, _ in frames):
                return B_ENC
            return B_DEC
        if STATE.search(sym) and not COMPACT_CONTEXT.search(sym):
            return B_STATE
        if COMPACT_CONTEXT.search(sym):
            return B_COMPACT
        if SOLVE.search(sym):
            return B_SOLVE
        if WATCH.search(sym):
            return B_WATCH
        if LOGS.search(sym):
            return B_LOGS
        if OURS.search(sym):
            return B_OURS
        if RUNTIME.search(sym):
            return B_RUNTIME
        if GENERIC.search(sym):
            continue
        return B_OTHER
    return B_KERNEL if kernel_leaf else B_OTHER


def bucket(frames):
    b = first_bucket(frames)
    if b in (B_DEC, B_ENC, B_STATE, B_OURS, B_OTHER) and any(
            COMPACT_CONTEXT.search(f) for f, _ in frames):
        return B_COMPACT
    return b


def handler(frames):
    ours = [f for f, _ in frames if f.startswith(('karpenter_capi::', '<karpenter_capi::'))
            or f.startswith('core::ptr::drop_in_place<karpenter_capi::')]
    if not ours:
        return '(no controller frame: connections, watch streams) ' + bucket(frames)
    name = re.sub(r'::\{\{closure\}\}', '', ours[-1])
    name = re.sub(r'^<karpenter_capi::actors::(\w+)::(\w+) as actix::stream::StreamHandler<.*',
                  r'\2 watch handler', name)
    name = re.sub(r'^<karpenter_capi::api::decode::Lenient<K> as .*',
                  'Lenient<K> decoding (NodeClaims, NodePools, node classes)', name)
    name = re.sub(r'^karpenter_capi::actors::provisioner::watch::.*',
                  'Provisioner pod watch handler', name)
    name = re.sub(r'^<karpenter_capi::retry_after::RetryAfter.*', 'RetryAfter (client layer)', name)
    return name.replace('karpenter_capi::', '')[:110]


def table(title, runs, key, top=None):
    names = [n for n, _, _ in runs]
    sums = []
    for _, samples, per in runs:
        c = collections.Counter(key(s['frames']) for s in samples)
        sums.append({k: v * per for k, v in c.items()})
    keys = sorted(set().union(*sums), key=lambda k: -max(s.get(k, 0) for s in sums))
    if key is bucket:
        keys = [k for k in ORDER if k in keys]
    elif len(sums) == 2:
        keys.sort(key=lambda k: -(sums[1].get(k, 0) - sums[0].get(k, 0)))
    print(f'\n{title} (CPU ms per claim)\n')
    delta = len(runs) == 2
    print('| | ' + ' | '.join(names) + (' | difference |' if delta else ' |'))
    print('|---' * (len(runs) + 1 + delta) + '|')
    for k in keys[:top]:
        v = [s.get(k, 0) for s in sums]
        print(f'| {k} | ' + ' | '.join(f'{x:.2f}' for x in v)
              + (f' | {v[1] - v[0]:+.2f} |' if delta else ' |'))
    t = [sum(s.values()) for s in sums]
    print('| total | ' + ' | '.join(f'{x:.2f}' for x in t)
          + (f' | {t[1] - t[0]:+.2f} |' if delta else ' |'))


def main(argv):
    hz = 499.0
    if len(argv) > 1 and argv[0] == '--hz':
        hz, argv = float(argv[1]), argv[2:]
    if not argv:
        sys.exit(__doc__)
    runs = []
    for arg in argv:
        name, rest = arg.split('=', 1)
        path, claims = rest.rsplit(':', 1)
        samples = parse(path)
        runs.append((name, samples, 1000.0 / hz / int(claims)))
        print(f'{name}: {len(samples)} samples, {len(samples) * 1000.0 / hz:.0f} ms of CPU, '
              f'{len(samples) * 1000.0 / hz / int(claims):.2f} ms per claim')
    table('Buckets', runs, bucket)
    table('Outermost controller frame', runs, handler, top=20)
    for name, samples, per in runs:
        c = collections.Counter(s['frames'][0][0] if s['frames'] else '?' for s in samples)
        print(f'\nTop self symbols, {name} (share of its samples, CPU ms per claim)\n')
        for sym, k in c.most_common(10):
            print(f'  {100.0 * k / len(samples):4.1f} %  {k * per:5.2f}  {sym[:140]}')


if __name__ == '__main__':
    main(sys.argv[1:])
