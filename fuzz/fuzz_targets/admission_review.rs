#![no_main]
// See fuzz/README.md; the harness is ratekeeper::fuzzing::admission_review.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper::fuzzing::admission_review(data));
