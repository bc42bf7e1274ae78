//! Collects every diagnostic of one attribute so they are reported together.

use proc_macro2::TokenStream;

/// An accumulator of [`syn::Error`]s.
///
/// Each check pushes what it finds and carries on, so a user who made three
/// mistakes sees three errors in one build instead of one per build.
#[derive(Default)]
pub(crate) struct Errors {
    combined: Option<syn::Error>,
}

impl Errors {
    /// Records one error next to the ones already collected.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.combined {
            Some(combined) => combined.combine(error),
            None => self.combined = Some(error),
        }
    }

    /// Returns the value of `result`, or records its error and returns `None`.
    pub(crate) fn keep<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|error| self.push(error)).ok()
    }

    /// `Ok(())` if nothing was recorded, otherwise every error combined.
    pub(crate) fn finish(self) -> syn::Result<()> {
        self.combined.map_or(Ok(()), Err)
    }

    /// The `compile_error!` invocations of everything recorded (empty if nothing was).
    pub(crate) fn to_compile_errors(&self) -> TokenStream {
        self.combined
            .as_ref()
            .map(syn::Error::to_compile_error)
            .unwrap_or_default()
    }
}
