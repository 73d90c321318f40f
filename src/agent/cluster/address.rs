//! What an API server address may look like (`LACE_APISERVER_ADDRESS`, or the in-cluster
//! `KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT`), and what is wrong with one that is not.

use std::net::IpAddr;

/// Why a value is not an API server address.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("empty")]
    Empty,
    #[error(transparent)]
    Uri(#[from] http::uri::InvalidUri),
    #[error("scheme {0:?} is neither https nor http")]
    Scheme(Option<String>),
    #[error("no host")]
    NoHost,
    #[error("port {0:?} is not a number")]
    Port(String),
    #[error("a path ({0}) is not supported")]
    Path(String),
    #[error("credentials in the address are not supported")]
    Credentials,
}

/// Parses an API server address: `host:port`, `[v6]:port`, a bare host or IP (port 443), or
/// an `https://` (`http://`, for a local proxy) URL without a path.
pub fn parse_address(value: &str) -> Result<http::Uri, AddressError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(AddressError::Empty);
    }
    let url = if value.contains("://") {
        value.to_string()
    } else if let Ok(ip) = value.parse::<IpAddr>() {
        // A bare IPv6 address has colons but no port.
        match ip {
            IpAddr::V4(v4) => format!("https://{v4}"),
            IpAddr::V6(v6) => format!("https://[{v6}]"),
        }
    } else {
        format!("https://{value}")
    };
    let uri: http::Uri = url.parse()?;
    match uri.scheme_str() {
        Some("https" | "http") => {}
        other => return Err(AddressError::Scheme(other.map(str::to_string))),
    }
    let Some(authority) = uri.authority() else {
        return Err(AddressError::NoHost);
    };
    if authority.host().is_empty() {
        return Err(AddressError::NoHost);
    }
    let after_host = authority
        .as_str()
        .rsplit_once(']')
        .map_or(authority.as_str(), |(_, rest)| rest);
    if let Some((_, port)) = after_host.rsplit_once(':') {
        if port.parse::<u16>().is_err() {
            return Err(AddressError::Port(port.to_string()));
        }
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(AddressError::Path(uri.path().to_string()));
    }
    if authority.as_str().contains('@') {
        return Err(AddressError::Credentials);
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_every_form_the_chart_and_operators_write() {
        let ok = |a: &str| parse_address(a).unwrap().to_string();
        assert_eq!(ok("192.0.2.10:6443"), "https://192.0.2.10:6443/");
        assert_eq!(ok("192.0.2.10"), "https://192.0.2.10/");
        assert_eq!(ok("[2001:db8::1]:6443"), "https://[2001:db8::1]:6443/");
        assert_eq!(ok("2001:db8::1"), "https://[2001:db8::1]/");
        assert_eq!(ok("api.example.com:443"), "https://api.example.com:443/");
        assert_eq!(ok("api.example.com"), "https://api.example.com/");
        assert_eq!(
            ok("https://api.example.com:6443"),
            "https://api.example.com:6443/"
        );
        assert_eq!(ok(" http://127.0.0.1:8001/ "), "http://127.0.0.1:8001/");
        let bad = |a: &str| parse_address(a).unwrap_err();
        assert!(matches!(bad(""), AddressError::Empty));
        assert!(matches!(bad("ftp://x"), AddressError::Scheme(Some(s)) if s == "ftp"));
        assert!(matches!(bad("https://x/api"), AddressError::Path(p) if p == "/api"));
        assert!(matches!(bad("a b:1"), AddressError::Uri(_)));
        assert!(matches!(bad("https://u@x"), AddressError::Credentials));
        // With a password the port check refuses it first.
        assert!(matches!(bad("https://u:p@x"), AddressError::Port(_)));
        assert!(matches!(bad("host:port"), AddressError::Port(p) if p == "port"));
    }
}
