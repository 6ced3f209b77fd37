//! The control plane's certificates and keys, made in-process: a CA, the API server's serving
//! certificate, one client certificate per user (admin, scheduler, controller-manager, the
//! controller under test) and the service-account signing key pair. Everything is written as
//! PEM into the control plane's temporary directory, where the binaries read it.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::Error;

/// The first address of the service range (`--service-cluster-ip-range`): the `kubernetes`
/// Service gets it, so the serving certificate names it as upstream clusters do.
pub const SERVICE_RANGE: &str = "10.0.0.0/24";
const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Every file the control plane's binaries are given.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca: PathBuf,
    /// The CA of request-header (front-proxy) clients; nothing is signed with it yet.
    pub front_proxy_ca: PathBuf,
    pub serving: Pair,
    pub admin: Pair,
    pub scheduler: Pair,
    pub controller_manager: Pair,
    /// The controller under test, an administrator under a user of its own.
    pub controller: Pair,
    /// Cluster API's controller manager (module `cluster_api`): a user with no group, granted
    /// upstream's ClusterRole only.
    pub cluster_api: Pair,
    /// What the `<cluster>-kubeconfig` Secret gives Cluster API for the workload cluster (here the
    /// same API server): an administrator, as the kubeconfig a control-plane provider writes,
    /// under a user of its own so the audit log tells its requests apart.
    pub cluster_api_workload: Pair,
    /// The service-account signing key (PKCS#8) and its public half.
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
}

/// Makes the certificates and keys and writes them into `dir`.
pub fn write(dir: &Path) -> Result<Pki, Error> {
    let ca_path = dir.join("ca.crt");
    let ca = authority(&ca_path, "karpenter-capi-test-ca")?;
    let front_proxy_ca = dir.join("front-proxy-ca.crt");
    authority(&front_proxy_ca, "karpenter-capi-test-front-proxy-ca")?;

    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
    ])?;
    serving.subject_alt_names.extend([
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::IpAddress(IpAddr::V4(SERVICE_IP)),
    ]);
    serving.distinguished_name = name("kube-apiserver", None);
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving = leaf(dir, "apiserver", serving, &ca)?;

    // kube-apiserver maps a client certificate's CN to the user and each O to a group; these
    // are the users the bootstrap RBAC policy grants the admin, scheduler and controller-manager
    // roles to.
    let admin = client(
        dir,
        "admin",
        "kubernetes-admin",
        Some("system:masters"),
        &ca,
    )?;
    let scheduler = client(dir, "kube-scheduler", "system:kube-scheduler", None, &ca)?;
    let controller_manager = client(
        dir,
        "kube-controller-manager",
        "system:kube-controller-manager",
        None,
        &ca,
    )?;

    let controller = client(
        dir,
        "controller",
        super::CONTROLLER_USER,
        Some("system:masters"),
        &ca,
    )?;

    let cluster_api = client(dir, "cluster-api", super::CLUSTER_API_USER, None, &ca)?;
    let cluster_api_workload = client(
        dir,
        "cluster-api-workload",
        super::CLUSTER_API_WORKLOAD_USER,
        Some("system:masters"),
        &ca,
    )?;

    let sa = KeyPair::generate()?;
    let service_account_key = dir.join("sa.key");
    let service_account_pub = dir.join("sa.pub");
    put(&service_account_key, &sa.serialize_pem())?;
    put(&service_account_pub, &sa.public_key_pem())?;

    Ok(Pki {
        ca: ca_path,
        front_proxy_ca,
        serving,
        admin,
        scheduler,
        controller_manager,
        controller,
        cluster_api,
        cluster_api_workload,
        service_account_key,
        service_account_pub,
    })
}

/// A self-signed CA, its certificate written to `cert`; its key stays in memory.
pub(super) fn authority(cert: &Path, common: &str) -> Result<Issuer<'static, KeyPair>, Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    put(cert, &params.self_signed(&key)?.pem())?;
    Ok(Issuer::new(params, key))
}

pub(super) fn name(common: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common);
    if let Some(o) = organization {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

fn client(
    dir: &Path,
    file: &str,
    user: &str,
    group: Option<&str>,
    ca: &Issuer<'_, KeyPair>,
) -> Result<Pair, Error> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(user, group);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    leaf(dir, file, params, ca)
}

pub(super) fn leaf(
    dir: &Path,
    file: &str,
    mut params: CertificateParams,
    ca: &Issuer<'_, KeyPair>,
) -> Result<Pair, Error> {
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    let pair = Pair {
        cert: dir.join(format!("{file}.crt")),
        key: dir.join(format!("{file}.key")),
    };
    put(&pair.cert, &cert.pem())?;
    put(&pair.key, &key.serialize_pem())?;
    Ok(pair)
}

fn put(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        what: format!("writing {}", path.display()),
        source,
    })
}
