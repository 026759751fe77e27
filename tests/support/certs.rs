//! Test certificates, made at test time with rcgen: a [`TestCa`] issues server and client
//! certificates ([`Leaf`]) that tests write into their temp dirs as PEM files.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A certificate authority (self-signed).
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("ca key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-signed ca");
        TestCa { issuer }
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes the CA certificate to `dir/name`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        write_atomically(dir, name, &self.cert_pem())
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for `names` (its SANs).
    pub fn client(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A cluster peer's certificate for `names`: it serves the peer listener and dials
    /// the other peers with it.
    pub fn peer(&self, names: &[&str]) -> Leaf {
        self.leaf_for(
            names,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        self.leaf_for(names, vec![usage])
    }

    fn leaf_for(&self, names: &[&str], usages: Vec<ExtendedKeyUsagePurpose>) -> Leaf {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.extended_key_usages = usages;
        params.distinguished_name.push(DnType::CommonName, "leaf");
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed leaf");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl Leaf {
    /// Writes `dir/<name>.crt` and `dir/<name>.key`; returns (cert, key) paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        (
            write_atomically(dir, &format!("{name}.crt"), &self.cert_pem),
            write_atomically(dir, &format!("{name}.key"), &self.key_pem),
        )
    }
}

/// Writes `dir/name` through a temp file and a rename, as a certificate manager does, so a
/// reader never sees half a file.
pub fn write_atomically(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let temp = dir.join(format!(".{name}.tmp"));
    fs::write(&temp, text).unwrap_or_else(|error| panic!("write {}: {error}", temp.display()));
    fs::rename(&temp, &path)
        .unwrap_or_else(|error| panic!("rename to {}: {error}", path.display()));
    path
}
