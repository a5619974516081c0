//! The gateway's upstream TLS: rustls with the ring provider, trusting the webpki (Mozilla)
//! roots, the host's native roots and the PEM certificates of an optional CA file.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

/// The webpki and native roots, loaded once per process.
fn base_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned());
        // Unreadable native stores are not fatal: the webpki roots remain.
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        roots
    })
}

/// A client config trusting the base roots plus every certificate in `ca_file` (PEM; a file
/// without one is an error).
pub(crate) fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = base_roots().clone();
    if let Some(path) = ca_file {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("CA file {shown}: {e}"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("CA file {shown}: {e}"))?;
        if certs.is_empty() {
            return Err(format!("CA file {shown}: no PEM certificate in it"));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("CA file {shown}: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
