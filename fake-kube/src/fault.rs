//! What the test makes go wrong: the server as a whole ([`Mode`]) or chosen requests
//! ([`Fault`]).

use serde_json::Value;

/// How the fake answers every request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Up,
    /// Connections are refused (in process only: over TCP requests are answered as when
    /// up); open watches end.
    Refusing,
    /// Every request is answered with this HTTP status (a `Status` body); open watches end.
    Status(u16),
}

/// An error answer for requests with an RBAC `verb` (`list`, `patch`) on a `path` (without
/// the query).
#[derive(Clone, Debug)]
pub struct Fault {
    pub verb: String,
    pub path: String,
    pub code: u16,
    pub message: String,
    /// How many matching requests fail (`None`: all).
    pub times: Option<usize>,
    /// A concurrent writer's change, stored before the error is answered (a 409 then means
    /// what it means on a real server).
    pub update: Option<Value>,
}

impl Fault {
    pub fn new(verb: &str, path: &str, code: u16, message: &str) -> Fault {
        Fault {
            verb: verb.into(),
            path: path.into(),
            code,
            message: message.into(),
            times: None,
            update: None,
        }
    }

    /// Only the next `n` matching requests fail.
    pub fn times(mut self, n: usize) -> Fault {
        self.times = Some(n);
        self
    }

    /// `object` is stored (as another client's write) before the error is answered.
    pub fn after_update(mut self, object: Value) -> Fault {
        self.update = Some(object);
        self
    }
}

/// The `reason` of a `Status` with `code`.
pub(crate) fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        _ => "InternalError",
    }
}
