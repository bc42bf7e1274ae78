//! Deliberate panics in test bodies: their text, and keeping them out of
//! the output.

use std::any::Any;

/// The text of a panic's payload.
pub fn panic_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<not text>".to_owned())
}

/// Keeps the deliberate panics of the bodies (their text says
/// `deliberate`) out of the output; every other panic is reported as usual.
pub fn quiet_deliberate_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !panic_text(info.payload()).contains("deliberate") {
                report(info);
            }
        }));
    });
}
