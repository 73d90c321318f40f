//! A response body: one JSON document, or a watch's stream of events that lasts until the
//! fake ends the watch.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use tokio::sync::mpsc::UnboundedReceiver;

/// See the module docs. The default is an empty body.
#[derive(Debug, Default)]
pub struct FakeBody {
    once: Option<Bytes>,
    stream: Option<UnboundedReceiver<Bytes>>,
}

impl FakeBody {
    pub(crate) fn json(body: &serde_json::Value) -> FakeBody {
        FakeBody {
            once: Some(Bytes::from(body.to_string())),
            stream: None,
        }
    }

    pub(crate) fn stream(events: UnboundedReceiver<Bytes>) -> FakeBody {
        FakeBody {
            once: None,
            stream: Some(events),
        }
    }
}

impl http_body::Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(b) = self.once.take() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        match &mut self.stream {
            Some(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
            None => Poll::Ready(None),
        }
    }
}
