//! A response body that runs a callback once, when the body is dropped:
//! after its last frame was written, or when the connection went away
//! mid-stream. The HTTP metrics and the access log both finish their
//! record of a request there, so a streamed response is counted with its
//! whole duration.

use axum::body::Body;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// `inner`, passed through frame by frame, then `on_end`.
pub struct OnBodyEnd<F: FnOnce() + Send + Unpin + 'static> {
    inner: Body,
    on_end: Option<F>,
}

impl<F: FnOnce() + Send + Unpin + 'static> OnBodyEnd<F> {
    /// `inner` as a body that calls `on_end` when it is dropped.
    pub fn wrap(inner: Body, on_end: F) -> Body {
        Body::new(OnBodyEnd {
            inner,
            on_end: Some(on_end),
        })
    }
}

impl<F: FnOnce() + Send + Unpin + 'static> Drop for OnBodyEnd<F> {
    fn drop(&mut self) {
        if let Some(f) = self.on_end.take() {
            f();
        }
    }
}

impl<F: FnOnce() + Send + Unpin + 'static> http_body::Body for OnBodyEnd<F> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
