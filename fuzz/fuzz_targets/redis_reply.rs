#![no_main]
// See fuzz/README.md; the harness is ratekeeper::fuzzing::redis_reply.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratekeeper::fuzzing::redis_reply(data));
