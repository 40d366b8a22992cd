//! Where the remote tier lives, as `strata serve --remote-storage` names it. Pure: the URL is
//! checked here, the store is built by the tier thread.

use std::path::PathBuf;

/// A remote tier's location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteLocation {
    /// `s3://bucket/prefix`: an S3-protocol store, configured by the usual AWS environment.
    S3 { bucket: String, prefix: String },
    /// `file:///path`: a folder, such as a NAS mount.
    File { root: PathBuf, prefix: String },
}

impl RemoteLocation {
    /// Parses `s3://bucket[/prefix]` or `file:///absolute/path`.
    pub fn parse(url: &str) -> Result<RemoteLocation, String> {
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let valid_bucket = (3..=63).contains(&bucket.len())
                && bucket.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if !valid_bucket {
                return Err(format!(
                    "{url}: {bucket:?} is not an S3 bucket name (3 to 63 lowercase letters, digits, '-' or '.')"
                ));
            }
            return Ok(RemoteLocation::S3 {
                bucket: bucket.to_string(),
                prefix: clean_prefix(url, prefix)?,
            });
        }
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "{url}: a file URL needs an absolute path (file:///...)"
                ));
            }
            return Ok(RemoteLocation::File {
                root: PathBuf::from(path),
                prefix: String::new(),
            });
        }
        Err(format!(
            "{url}: expected s3://bucket/prefix or file:///path"
        ))
    }

    /// The prefix every object name starts with (empty or ending in `/`).
    pub fn prefix(&self) -> &str {
        match self {
            RemoteLocation::S3 { prefix, .. } | RemoteLocation::File { prefix, .. } => prefix,
        }
    }
}

fn clean_prefix(url: &str, prefix: &str) -> Result<String, String> {
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|part| part == "." || part == "..") || prefix.contains("//") {
        return Err(format!(
            "{url}: the prefix may not hold '.', '..' or empty parts"
        ));
    }
    Ok(if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    })
}

/// The folder of one partition's objects, under the tier's prefix: the topic's name, its id
/// (a topic deleted and created again under its name starts a new folder), the partition.
pub fn partition_folder(prefix: &str, topic: &str, topic_id: &str, partition: u32) -> String {
    format!("{prefix}{topic}-{topic_id}/{partition}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_and_file_urls_parse_and_anything_else_is_refused_with_a_reason() {
        assert_eq!(
            RemoteLocation::parse("s3://my-bucket/strata/prod/").unwrap(),
            RemoteLocation::S3 {
                bucket: "my-bucket".into(),
                prefix: "strata/prod/".into()
            }
        );
        assert_eq!(
            RemoteLocation::parse("s3://my-bucket").unwrap().prefix(),
            ""
        );
        assert_eq!(
            RemoteLocation::parse("file:///mnt/nas/strata").unwrap(),
            RemoteLocation::File {
                root: "/mnt/nas/strata".into(),
                prefix: String::new()
            }
        );
        for bad in [
            "http://x/y",
            "s3://",
            "s3://UPPER/x",
            "s3://ok-bucket/a/../b",
            "file://relative/path",
            "/just/a/path",
        ] {
            let error = RemoteLocation::parse(bad).unwrap_err();
            assert!(error.starts_with(bad), "{error}");
        }
    }
}
