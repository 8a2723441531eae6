//! Per-thread words that cost a load, not a call, inside a shared library.
//!
//! Rust's `thread_local!` in a cdylib uses the global-dynamic TLS model: every access is a
//! call to `__tls_get_addr`. The read and write paths read one per-thread word on every
//! call (the hazard record's), so on x86-64 Linux [`thread_word!`] defines it in assembly,
//! in `.tbss`, and reads its offset from the thread pointer through the GOT, as C's
//! `__attribute__((tls_model("initial-exec")))` does: two loads (stable Rust cannot choose
//! the model). Elsewhere the word is a `thread_local!` cell.
//!
//! The cost of the model: libcascade.so is marked `STATIC_TLS`, so its TLS block (about 200
//! bytes) must live in the static TLS area. Loaded at start (LD_PRELOAD, `-lcascade`) that
//! is free; a program that dlopen's libcascade.so takes it from glibc's surplus kept for
//! such libraries (`glibc.rtld.optional_static_tls`, 512 bytes by default), and dlopen
//! fails if that is used up. The store crate, which the dlopen'ed Python extension links,
//! has none.
//!
//! A word starts as 0 in every thread, and is never destroyed: it stays readable in the
//! thread's TLS destructors.

/// Defines `$name`, a type with `get() -> u64` and `set(u64)` on this thread's word, named
/// `$symbol` in the object file (hidden: not exported from libcascade.so). The symbol must
/// be unique in the final link.
macro_rules! thread_word {
    ($(#[$meta:meta])* $vis:vis struct $name:ident = $symbol:literal;) => {
        $(#[$meta])*
        $vis struct $name;

        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        ::core::arch::global_asm!(
            ".pushsection .tbss,\"awT\",@nobits",
            ".p2align 3",
            concat!(".globl ", $symbol),
            concat!(".hidden ", $symbol),
            concat!(".type ", $symbol, ",@object"),
            concat!(".size ", $symbol, ",8"),
            concat!($symbol, ":"),
            ".zero 8",
            ".popsection",
        );

        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        impl $name {
            /// This thread's word: the thread pointer (`%fs:0`, the TCB's pointer to itself
            /// in the x86-64 TLS ABI) plus the word's offset, which the loader put in the GOT.
            #[inline(always)]
            fn slot() -> *mut u64 {
                let offset: usize;
                let thread: usize;
                // SAFETY: two loads, of a GOT entry the loader filled in before any code of
                // this object ran, and of the TCB's first word; neither changes in a thread.
                unsafe {
                    ::core::arch::asm!(
                        concat!("mov {o}, qword ptr [rip + ", $symbol, "@GOTTPOFF]"),
                        "mov {t}, qword ptr fs:[0]",
                        o = out(reg) offset,
                        t = out(reg) thread,
                        options(pure, readonly, nostack, preserves_flags),
                    );
                }
                thread.wrapping_add(offset) as *mut u64
            }

            #[inline(always)]
            #[allow(dead_code)]
            $vis fn get() -> u64 {
                // SAFETY: the word is this thread's, 8-byte aligned, and lives as long as
                // the thread; only this thread reaches it, by this type.
                unsafe { Self::slot().read() }
            }

            #[inline(always)]
            #[allow(dead_code)]
            $vis fn set(value: u64) {
                // SAFETY: as in `get`.
                unsafe { Self::slot().write(value) }
            }
        }

        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        impl $name {
            #[inline(always)]
            fn cell<R>(f: impl FnOnce(&::std::cell::Cell<u64>) -> R) -> R {
                ::std::thread_local! {
                    static WORD: ::std::cell::Cell<u64> = const { ::std::cell::Cell::new(0) };
                }
                WORD.with(f)
            }

            #[inline(always)]
            #[allow(dead_code)]
            $vis fn get() -> u64 {
                Self::cell(|c| c.get())
            }

            #[inline(always)]
            #[allow(dead_code)]
            $vis fn set(value: u64) {
                Self::cell(|c| c.set(value))
            }
        }
    };
}
pub(crate) use thread_word;

#[cfg(test)]
mod tests {
    super::thread_word! {
        struct Word = "cascade_preload_thread_word_test";
    }

    #[test]
    fn each_thread_has_its_own_word_starting_at_zero() {
        Word::set(7);
        let others: Vec<u64> = (0..4u64)
            .map(|i| {
                std::thread::spawn(move || {
                    let first = Word::get();
                    Word::set(100 + i);
                    std::thread::yield_now();
                    first * 1000 + Word::get()
                })
            })
            .map(|t| t.join().unwrap())
            .collect();
        assert_eq!(others, [100, 101, 102, 103], "a word shared or not zeroed");
        assert_eq!(Word::get(), 7, "another thread's set reached this one");
    }
}
