//! Certificates for TLS tests, made fresh by the `openssl` command.

use std::process::Command;

/// A CA and a server certificate for `127.0.0.1` and `localhost`, made
/// fresh with the `openssl` command, for TLS tests.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    /// The CA certificate, PEM.
    pub ca: Vec<u8>,
    /// The server certificate, signed by the CA, PEM.
    pub server_cert: Vec<u8>,
    /// The server's private key, PEM.
    pub server_key: Vec<u8>,
}

impl TestCertificates {
    /// Makes a CA and a server certificate in a scratch folder.
    ///
    /// # Panics
    /// When the `openssl` command is missing or fails: TLS tests must fail
    /// loudly, never skip.
    pub fn generate() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "dlock-certs-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("scratch folder: {e}"));
        let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let ext = path("ext.cnf");
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap_or_else(|e| panic!("write {ext}: {e}"));
        let steps: [Vec<String>; 3] = [
            [
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=dlock test CA",
                "-keyout",
                &path("ca.key"),
                "-out",
                &path("ca.crt"),
            ]
            .map(str::to_owned)
            .to_vec(),
            [
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=localhost",
                "-keyout",
                &path("server.key"),
                "-out",
                &path("server.csr"),
            ]
            .map(str::to_owned)
            .to_vec(),
            [
                "x509",
                "-req",
                "-in",
                &path("server.csr"),
                "-CA",
                &path("ca.crt"),
                "-CAkey",
                &path("ca.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &path("server.crt"),
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for args in steps {
            let out = Command::new("openssl")
                .args(&args)
                .output()
                .unwrap_or_else(|e| {
                    panic!("TLS tests need the `openssl` command (apt-get install openssl): {e}")
                });
            assert!(
                out.status.success(),
                "openssl {} failed: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let read = |f: &str| std::fs::read(path(f)).unwrap_or_else(|e| panic!("read {f}: {e}"));
        let certs = TestCertificates {
            ca: read("ca.crt"),
            server_cert: read("server.crt"),
            server_key: read("server.key"),
        };
        let _ = std::fs::remove_dir_all(&dir);
        certs
    }
}
