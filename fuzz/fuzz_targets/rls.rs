#![no_main]
// See fuzz/README.md; the harness is ratekeeper::fuzzing::rls.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper::fuzzing::rls(data));
