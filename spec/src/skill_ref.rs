//! `remote:OWNER/REPO[/SKILL][@REF]` skill references: their syntax, shared by `validate`
//! (located diagnostics) and the engine's fetcher (which owns the network and the cache).

/// Longest REF accepted.
pub const MAX_REF_LEN: usize = 200;

/// A parsed `remote:` skill reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRef {
    /// Repository owner.
    pub owner: String,
    /// Repository name.
    pub repo: String,
    /// Skill directory name; `None`: the repository root is the skill.
    pub skill: Option<String>,
    /// Branch, tag or commit; `None`: the default branch.
    pub reference: Option<String>,
}

impl RemoteRef {
    /// Parses `OWNER/REPO[/SKILL][@REF]` (the value after `remote:`).
    pub fn parse(value: &str) -> Result<RemoteRef, String> {
        let (path, reference) = match value.split_once('@') {
            Some((p, r)) => (p, Some(r)),
            None => (value, None),
        };
        let parts: Vec<&str> = path.split('/').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(format!(
                "`{value}` is not `OWNER/REPO` or `OWNER/REPO/SKILL` (optionally followed by `@REF`)"
            ));
        }
        for (i, p) in parts.iter().enumerate() {
            if p.is_empty() {
                return Err(format!("`{value}` has an empty part"));
            }
            if !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(format!(
                    "`{p}` may only use letters, digits, `-`, `_` and `.`"
                ));
            }
            if *p == "." || *p == ".." || (i == 2 && p.starts_with('.')) {
                return Err(format!("`{p}` is not a valid name here"));
            }
        }
        if let Some(r) = reference {
            check_ref(r)?;
        }
        Ok(RemoteRef {
            owner: parts[0].to_string(),
            repo: parts[1].to_string(),
            skill: parts.get(2).map(|s| s.to_string()),
            reference: reference.map(str::to_string),
        })
    }

    /// The skill's name: the skill directory, else the repository.
    pub fn name(&self) -> &str {
        self.skill.as_deref().unwrap_or(&self.repo)
    }

    /// The REF fetched: the one given, else `HEAD`.
    pub fn reference_or_head(&self) -> &str {
        self.reference.as_deref().unwrap_or("HEAD")
    }

    /// Whether the REF is a full commit SHA (immutable, so served from the cache).
    pub fn is_commit(&self) -> bool {
        self.reference.as_deref().is_some_and(is_full_sha)
    }

    /// The same skill pinned to `commit`.
    pub fn pinned(&self, commit: &str) -> RemoteRef {
        RemoteRef {
            reference: Some(commit.to_string()),
            ..self.clone()
        }
    }
}

impl std::fmt::Display for RemoteRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.repo)?;
        if let Some(s) = &self.skill {
            write!(f, "/{s}")?;
        }
        if let Some(r) = &self.reference {
            write!(f, "@{r}")?;
        }
        Ok(())
    }
}

/// Checks a REF: 1-[`MAX_REF_LEN`] characters of `[A-Za-z0-9._/-]`, not starting with `-`,
/// no `..`, no empty `/`-separated part.
pub fn check_ref(r: &str) -> Result<(), String> {
    if r.is_empty() {
        return Err("nothing after `@` (expected a branch, tag or commit)".into());
    }
    if r.len() > MAX_REF_LEN {
        return Err(format!("ref is longer than {MAX_REF_LEN} characters"));
    }
    if !r
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
    {
        return Err(format!(
            "ref `{r}` may only use letters, digits, `.`, `_`, `/` and `-`"
        ));
    }
    if r.starts_with('-') {
        return Err(format!("ref `{r}` must not start with `-`"));
    }
    if r.contains("..") {
        return Err(format!("ref `{r}` must not contain `..`"));
    }
    if r.split('/').any(str::is_empty) {
        return Err(format!("ref `{r}` has an empty `/`-separated part"));
    }
    Ok(())
}

/// Whether `s` is a full (40 hex digit) commit SHA.
pub fn is_full_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}
