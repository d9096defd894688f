//! A tiny certificate authority: the lab's cluster CA and nodemedic's peer-certificate signer.
//! ECDSA P-256 throughout (ring), which Kubernetes and rustls both accept.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

#[derive(Debug, thiserror::Error)]
#[error("certificate generation failed: {0}")]
pub struct PkiError(#[from] rcgen::Error);

/// A certificate and its private key, PEM-encoded.
#[derive(Clone, Debug)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pem: Pem,
}

/// What a leaf certificate is for.
#[derive(Clone, Debug, Default)]
pub struct Leaf {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub server: bool,
    pub client: bool,
    pub valid_days: i64,
}

fn params(common_name: &str, valid_days: i64) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, common_name);
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(valid_days.max(1));
    Ok(params)
}

impl Authority {
    pub fn new(common_name: &str, valid_days: i64) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = params(common_name, valid_days)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let pem = Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Ok(Self {
            issuer: Issuer::new(params, key),
            pem,
        })
    }

    /// Loads an authority from PEM (e.g. a Secret).
    pub fn from_pem(pem: &Pem) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(&pem.key)?;
        let issuer = Issuer::from_ca_cert_pem(&pem.cert, key)?;
        Ok(Self {
            issuer,
            pem: pem.clone(),
        })
    }

    pub fn pem(&self) -> &Pem {
        &self.pem
    }

    pub fn issue(&self, leaf: &Leaf) -> Result<Pem, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = params(&leaf.common_name, leaf.valid_days)?;
        for org in &leaf.organizations {
            params.distinguished_name.push(DnType::OrganizationName, org.as_str());
        }
        for dns in &leaf.dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName(dns.as_str().try_into()?));
        }
        params
            .subject_alt_names
            .extend(leaf.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        if leaf.server {
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if leaf.client {
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

impl Authority {
    /// Signs a PEM certificate request for exactly `name` (common name and only DNS name),
    /// whatever else the request asked for: the caller has checked who may hold `name`.
    pub fn sign_request(&self, request_pem: &str, name: &str, valid_days: i64) -> Result<String, PkiError> {
        let mut request = rcgen::CertificateSigningRequestParams::from_pem(request_pem)?;
        let mut params = params(name, valid_days)?;
        params.subject_alt_names = vec![SanType::DnsName(name.try_into()?)];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        request.params = params;
        Ok(request.signed_by(&self.issuer)?.pem())
    }
}

/// A bare ECDSA key pair in PEM, private and public (e.g. service-account token signing, where
/// kube-apiserver reads the public half from its own file).
pub fn key_pair_pem() -> Result<Pem, PkiError> {
    let key = KeyPair::generate()?;
    Ok(Pem {
        cert: key.public_key_pem(),
        key: key.serialize_pem(),
    })
}
