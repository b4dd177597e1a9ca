// Thread-safety annotations: attributes that let clang's -Wthread-safety check, at compile time,
// that a member said to be guarded by a mutex is only touched with that mutex held, and that a
// function said to need a lock is only called with it held (the `thread-safety` preset builds
// with them on; `make check-thread-safety`).
//
// Terms (clang's): a capability is a lock-like object (folio::Mutex, mutex.h); a scoped
// capability is an RAII object that holds one for its lifetime (folio::MutexLock). Annotations
// name capabilities by expression: FOLIO_GUARDED_BY(mutex_), FOLIO_REQUIRES(cache.mutex_).
//
// Under compilers other than clang every macro expands to nothing, so they cost nothing and
// never change what the code does: they are checked claims, not behaviour.
#pragma once

#if defined(__clang__)
#define FOLIO_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define FOLIO_THREAD_ANNOTATION(x)
#endif

// On a class: its objects are capabilities; `name` appears in the warnings ("mutex").
#define FOLIO_CAPABILITY(name) FOLIO_THREAD_ANNOTATION(capability(name))
// On a class: an RAII holder whose constructor acquires and destructor releases.
#define FOLIO_SCOPED_CAPABILITY FOLIO_THREAD_ANNOTATION(scoped_lockable)

// On a data member: read or written only while `capability` is held (reads may hold it shared).
#define FOLIO_GUARDED_BY(capability) FOLIO_THREAD_ANNOTATION(guarded_by(capability))
// On a pointer member: the pointer itself is free to read, what it points to is guarded.
#define FOLIO_PT_GUARDED_BY(capability) FOLIO_THREAD_ANNOTATION(pt_guarded_by(capability))

// On a capability member: the lock order, checked with -Wthread-safety-beta only.
#define FOLIO_ACQUIRED_BEFORE(...) FOLIO_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define FOLIO_ACQUIRED_AFTER(...) FOLIO_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))

// On a function: the caller must hold the capabilities (exclusively, or at least shared) on
// entry, and still holds them on return.
#define FOLIO_REQUIRES(...) FOLIO_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define FOLIO_REQUIRES_SHARED(...) FOLIO_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// On a function: the caller must not hold them (the function takes them itself; a non-recursive
// mutex would deadlock). Checked only where the caller's own annotations say what it holds.
#define FOLIO_EXCLUDES(...) FOLIO_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// On a function: it acquires (releases) the capabilities and returns holding (not holding)
// them. With no argument on a member function of a capability, the capability is `*this`.
#define FOLIO_ACQUIRE(...) FOLIO_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define FOLIO_ACQUIRE_SHARED(...) FOLIO_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define FOLIO_RELEASE(...) FOLIO_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define FOLIO_RELEASE_SHARED(...) FOLIO_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
// On a function returning bool: it acquired the capabilities exactly when it returned `success`.
#define FOLIO_TRY_ACQUIRE(...) FOLIO_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// On a function: it checks at run time (aborting otherwise) that the capability is held, so the
// analysis may assume it is from there on.
#define FOLIO_ASSERT_CAPABILITY(capability) FOLIO_THREAD_ANNOTATION(assert_capability(capability))
// On a function: it returns (a reference to) the capability, so callers may name it through the
// call in their own annotations.
#define FOLIO_RETURN_CAPABILITY(capability) FOLIO_THREAD_ANNOTATION(lock_returned(capability))

// On a function: the analysis skips its body. The last resort, for locking the analysis cannot
// follow; every use says why beside it.
#define FOLIO_NO_THREAD_SAFETY_ANALYSIS FOLIO_THREAD_ANNOTATION(no_thread_safety_analysis)
