//! This process's stdin and stdout as epoll-driven pipes, for the extension side.
//!
//! `tokio::io::stdin()` and `stdout()` go through the blocking thread pool: every read and
//! write is a hand-off to another thread, which costs more than the round trip itself (measured
//! 256 µs against 192 µs idle, 138 against 72 awake). When stdin and stdout are
//! pipes — always, under the host — they are registered with the reactor instead. When they
//! are not (a terminal, a file), this falls back to tokio's blocking versions so that an
//! extension can still be run by hand.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::unix::pipe;

/// The read half: this process's stdin.
#[derive(Debug)]
pub enum Stdin {
    Pipe(pipe::Receiver),
    Other(tokio::io::Stdin),
}

/// The write half: this process's stdout.
#[derive(Debug)]
pub enum Stdout {
    Pipe(pipe::Sender),
    Other(tokio::io::Stdout),
}

/// Open stdin and stdout for a session. Must be called inside a tokio runtime.
pub fn stdio() -> (Stdin, Stdout) {
    let stdin = dup(io::stdin().as_fd())
        .and_then(pipe::Receiver::from_owned_fd)
        .map(Stdin::Pipe)
        .unwrap_or_else(|_| Stdin::Other(tokio::io::stdin()));
    let stdout = dup(io::stdout().as_fd())
        .and_then(pipe::Sender::from_owned_fd)
        .map(Stdout::Pipe)
        .unwrap_or_else(|_| Stdout::Other(tokio::io::stdout()));
    (stdin, stdout)
}

fn dup(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

impl AsyncRead for Stdin {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stdin::Pipe(p) => Pin::new(p).poll_read(cx, buf),
            Stdin::Other(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stdout {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stdout::Pipe(p) => Pin::new(p).poll_write(cx, buf),
            Stdout::Other(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stdout::Pipe(p) => Pin::new(p).poll_flush(cx),
            Stdout::Other(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stdout::Pipe(p) => Pin::new(p).poll_shutdown(cx),
            Stdout::Other(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
