//! "Did you mean …?" suggestions for misspelled names.

/// The candidate closest to `input`, if it is close enough to be a likely typo.
pub fn did_you_mean<'a, I>(input: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let input_lower = input.to_lowercase();
    candidates
        .into_iter()
        .filter(|c| *c != input)
        .map(|c| {
            let score = strsim::jaro_winkler(&input_lower, &c.to_lowercase());
            let distance = strsim::damerau_levenshtein(&input_lower, &c.to_lowercase());
            (c, score, distance)
        })
        .filter(|(c, score, distance)| *score >= 0.8 || *distance <= (c.len() / 3).max(1))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _, _)| c)
}

/// `a`, `b` and `c` formatted as a list for messages.
pub fn one_of<S: AsRef<str>>(items: &[S]) -> String {
    items
        .iter()
        .map(|s| format!("`{}`", s.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let fields = ["timeout_secs", "retries", "name", "prompt"];
        assert_eq!(did_you_mean("timeout_sec", fields), Some("timeout_secs"));
        assert_eq!(did_you_mean("nmae", fields), Some("name"));
        assert_eq!(did_you_mean("zzzzzz", fields), None);
        assert_eq!(did_you_mean("name", fields), None);
    }

    #[test]
    fn formats_lists() {
        assert_eq!(one_of(&["a", "b"]), "`a`, `b`");
    }
}
