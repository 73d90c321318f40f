//! The agent socket protocol: one newline-terminated JSON [`Request`] per connection,
//! answered by one newline-terminated JSON [`Response`].

use std::fmt;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Attachment, CniError, CniResult, CniVersion};

/// Upper bound of one protocol message (request or response line), so that neither side
/// can be made to buffer without limit.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// What the plugin asks the agent: the CNI verbs of Lace's own network (`VERSION` is
/// answered by the plugin alone), and the two of the `loopback` plugin that touch the kernel
/// (its `DEL`, `STATUS` and `GC` are answered by the plugin alone). The loopback ones are
/// verbs of their own, not a flag on `ADD`, so that an agent older than the plugin refuses
/// them (unknown variant) instead of taking them for a pod's `ADD`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Command {
    /// Attach a container.
    Add,
    /// Detach a container; idempotent.
    Del,
    /// Verify an attachment.
    Check,
    /// Is the agent ready to serve ADD?
    Status,
    /// Release everything not in the valid attachments.
    Gc,
    /// The `loopback` plugin's ADD: bring `lo` up in the sandbox and report its addresses.
    #[serde(rename = "LOOPBACK_ADD")]
    LoopbackAdd,
    /// The `loopback` plugin's CHECK: is `lo` up in the sandbox?
    #[serde(rename = "LOOPBACK_CHECK")]
    LoopbackCheck,
}

impl Command {
    /// The `CNI_COMMAND` spelling (`LOOPBACK_ADD` / `LOOPBACK_CHECK` for the loopback verbs,
    /// as on the wire and in the agent's metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::LoopbackAdd => "LOOPBACK_ADD",
            Command::LoopbackCheck => "LOOPBACK_CHECK",
        }
    }

    /// Parses a `CNI_COMMAND` value other than `VERSION` (the CNI verbs only).
    pub fn parse(s: &str) -> Option<Command> {
        [
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Status,
            Command::Gc,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    /// The loopback plugin's verb for CNI verb `self`: `ADD` and `CHECK` go to the agent as
    /// [`Command::LoopbackAdd`] and [`Command::LoopbackCheck`]; the others stay in the plugin.
    pub fn for_loopback(self) -> Option<Command> {
        match self {
            Command::Add => Some(Command::LoopbackAdd),
            Command::Check => Some(Command::LoopbackCheck),
            _ => None,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request from the plugin to the agent: everything the runtime told the plugin, already
/// validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The verb.
    pub command: Command,
    /// `CNI_CONTAINERID` (absent for `STATUS` and `GC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// `CNI_NETNS`, only when it names an existing network namespace (for `DEL` it may be
    /// gone already: then absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` (absent for `STATUS` and `GC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// `K8S_POD_NAMESPACE` from `CNI_ARGS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME` from `CNI_ARGS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// `K8S_POD_UID` from `CNI_ARGS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The configuration's version.
    pub cni_version: CniVersion,
    /// The whole configuration as the runtime passed it.
    pub config: Map<String, Value>,
    /// The configuration's `prevResult`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_result: Option<CniResult>,
    /// `GC` only: the attachments to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_attachments: Option<Vec<Attachment>>,
}

impl Request {
    /// A request for `command` with no attachment fields (STATUS, GC, VERSION-like verbs).
    pub fn without_attachment(command: Command, cni_version: CniVersion) -> Self {
        Self {
            command,
            container_id: None,
            netns: None,
            ifname: None,
            pod_namespace: None,
            pod_name: None,
            pod_uid: None,
            cni_version,
            config: Map::new(),
            prev_result: None,
            valid_attachments: None,
        }
    }
}

/// The agent's answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Response {
    /// Success; `ADD` carries the result, every other verb `null`.
    Ok(Option<CniResult>),
    /// Failure, passed on to the runtime as is (the plugin sets `cniVersion`).
    Err(CniError),
}

/// Why a protocol line cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Longer than [`MAX_MESSAGE_BYTES`].
    #[error("message is longer than {MAX_MESSAGE_BYTES} bytes")]
    TooLong,
    /// Not the expected JSON.
    #[error("message is not valid JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
}

/// Serializes `msg` as one protocol line (JSON and `\n`).
pub fn encode_line<T: Serialize>(msg: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut line = serde_json::to_vec(msg)?;
    line.push(b'\n');
    Ok(line)
}

/// Decodes one protocol line (with or without its `\n`).
pub fn decode_line<T: DeserializeOwned>(line: &[u8]) -> Result<T, FrameError> {
    if line.len() > MAX_MESSAGE_BYTES + 1 {
        return Err(FrameError::TooLong);
    }
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    Ok(serde_json::from_slice(line)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::spec::tests::sample_result;
    use crate::wire::ErrorCode;
    use serde_json::json;

    #[test]
    fn protocol_round_trips() {
        let req = Request {
            command: Command::Add,
            container_id: Some("abc".into()),
            netns: Some("/var/run/netns/cni-1".into()),
            ifname: Some("eth0".into()),
            pod_namespace: Some("default".into()),
            pod_name: Some("web-0".into()),
            pod_uid: None,
            cni_version: CniVersion::V1_0_0,
            config: json!({"cniVersion":"1.0.0","x":1})
                .as_object()
                .unwrap()
                .clone(),
            prev_result: Some(sample_result()),
            valid_attachments: None,
        };
        let line = encode_line(&req).unwrap();
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(
            line.iter().filter(|&&b| b == b'\n').count(),
            1,
            "exactly one line"
        );
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(text.contains(r#""command":"ADD""#) && text.contains(r#""cni_version":"1.0.0""#));
        assert_eq!(decode_line::<Request>(&line).unwrap(), req);

        for resp in [
            Response::Ok(Some(sample_result())),
            Response::Ok(None),
            Response::Err(CniError::new(ErrorCode::TRY_AGAIN_LATER, "busy").with_details("d")),
        ] {
            let line = encode_line(&resp).unwrap();
            assert_eq!(decode_line::<Response>(&line).unwrap(), resp);
        }
        assert_eq!(
            encode_line(&Response::Ok(None)).unwrap(),
            b"{\"ok\":null}\n"
        );
        let err: Response = decode_line(br#"{"err":{"code":50,"msg":"not ready"}}"#).unwrap();
        assert_eq!(
            err,
            Response::Err(CniError::new(ErrorCode::NOT_AVAILABLE, "not ready"))
        );
        assert!(matches!(
            decode_line::<Response>(&vec![b' '; MAX_MESSAGE_BYTES + 2]),
            Err(FrameError::TooLong)
        ));
    }

    #[test]
    fn loopback_verbs_have_names_of_their_own() {
        let mut req = Request::without_attachment(Command::LoopbackAdd, CniVersion::V0_3_1);
        req.netns = Some("/var/run/netns/cni-1".into());
        let line = encode_line(&req).unwrap();
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(
            text.contains(r#""command":"LOOPBACK_ADD""#)
                && text.contains(r#""cni_version":"0.3.1""#),
            "{text}"
        );
        assert_eq!(decode_line::<Request>(&line).unwrap(), req);
        // Only the CNI verbs come from CNI_COMMAND.
        assert_eq!(Command::parse("LOOPBACK_ADD"), None);
        assert_eq!(Command::parse("CHECK"), Some(Command::Check));
        assert_eq!(Command::Add.for_loopback(), Some(Command::LoopbackAdd));
        assert_eq!(Command::Check.for_loopback(), Some(Command::LoopbackCheck));
        assert_eq!(Command::Del.for_loopback(), None);
        // An agent that knows only the CNI verbs refuses them instead of attaching a pod.
        #[derive(Debug, Deserialize)]
        #[serde(rename_all = "UPPERCASE")]
        #[allow(dead_code)]
        enum OldCommand {
            Add,
            Del,
            Check,
            Status,
            Gc,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct OldRequest {
            command: OldCommand,
        }
        let err = decode_line::<OldRequest>(&line).unwrap_err().to_string();
        assert!(err.contains("unknown variant `LOOPBACK_ADD`"), "{err}");
    }
}
