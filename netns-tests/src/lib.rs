//! Helpers for the netns tests.
