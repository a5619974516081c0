//! One line for an error and its causes (HTTP clients nest the reason a request failed
//! several sources deep: "error sending request: client error (Connect): tcp connect
//! error: Connection refused").

/// `e` and its sources, `: `-separated; a source whose text is already in the line is
/// skipped.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn sources_are_joined_once() {
        let e = Outer(std::io::Error::other("refused"));
        assert_eq!(error_chain(&e), "outer: refused");
        let same = Outer(std::io::Error::other("outer"));
        assert_eq!(error_chain(&same), "outer");
    }
}
