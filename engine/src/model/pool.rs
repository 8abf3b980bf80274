//! Per-thread recycled buffers for the forward pass (no allocation in the
//! decode loop once warmed up).
//!
//! A [`PoolVec<T>`] is a `Vec<T>` taken from this thread's free list of `T` buffers and given
//! back, cleared but with its capacity, when dropped. Every temporary of a forward (and the
//! buffers a block hands to the next) is one, so after a warm-up step the same requests find
//! buffers of sufficient capacity and the global allocator is not called. Buffers whose size
//! follows the sequence length (index scores, candidate masks) grow by doubling, so they
//! reallocate only when the sequence crosses a power of two.
//!
//! Values are never reused: a taken buffer is empty (or explicitly filled), so results do not
//! depend on the pool. Memory held is the peak working set of the largest forward so far.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::thread::LocalKey;

/// An element type with a per-thread free list.
pub trait Poolable: Sized + 'static {
    fn free_list() -> &'static LocalKey<RefCell<Vec<Vec<Self>>>>;
}

macro_rules! poolable {
    ($($t:ty => $key:ident),* $(,)?) => {$(
        thread_local! {
            static $key: ::std::cell::RefCell<Vec<Vec<$t>>> =
                const { ::std::cell::RefCell::new(Vec::new()) };
        }
        impl $crate::model::pool::Poolable for $t {
            fn free_list(
            ) -> &'static ::std::thread::LocalKey<::std::cell::RefCell<Vec<Vec<$t>>>> {
                &$key
            }
        }
    )*};
}

pub(crate) use poolable;

poolable!(
    f32 => F32_BUFFERS,
    f64 => F64_BUFFERS,
    i64 => I64_BUFFERS,
    usize => USIZE_BUFFERS,
    bool => BOOL_BUFFERS,
    PoolVec<i64> => I64_LISTS,
    PoolVec<bool> => BOOL_LISTS,
);

/// A recycled `Vec<T>` (see the module note). Derefs to `Vec<T>`.
pub struct PoolVec<T: Poolable>(Vec<T>);

impl<T: Poolable> PoolVec<T> {
    /// An empty buffer: the most recently returned one, with its capacity. (Plain LIFO: in
    /// a steady sequence of requests each request meets the same buffer step after step, so
    /// capacities settle after warm-up.)
    pub fn new() -> PoolVec<T> {
        let v = T::free_list()
            .try_with(|l| l.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_default();
        PoolVec(v)
    }

    /// `len` copies of `value`.
    pub fn filled(len: usize, value: T) -> PoolVec<T>
    where
        T: Clone,
    {
        let mut v = PoolVec::new();
        v.grow_to(len);
        v.resize(len, value);
        v
    }

    /// A copy of `src`.
    pub fn from_slice(src: &[T]) -> PoolVec<T>
    where
        T: Clone,
    {
        let mut v = PoolVec::new();
        v.grow_to(src.len());
        v.extend_from_slice(src);
        v
    }

    /// Make room for `len` items, growing to the next power of two: a buffer whose size
    /// follows the sequence length then reallocates only when that length crosses one.
    fn grow_to(&mut self, len: usize) {
        if self.0.capacity() < len {
            let target = len.checked_next_power_of_two().unwrap_or(len);
            self.0.reserve_exact(target - self.0.len());
        }
    }

    /// The items of `iter`.
    pub fn collect(iter: impl IntoIterator<Item = T>) -> PoolVec<T> {
        let mut v = PoolVec::new();
        v.extend(iter);
        v
    }
}

impl<T: Poolable> Default for PoolVec<T> {
    fn default() -> Self {
        PoolVec::new()
    }
}

impl<T: Poolable> Drop for PoolVec<T> {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.0);
        v.clear(); // drops nested pooled items first, returning them to their own lists
        if v.capacity() > 0 {
            // During thread teardown the list may be gone: the buffer is then simply freed.
            let _ = T::free_list().try_with(|l| l.borrow_mut().push(v));
        }
    }
}

impl<T: Poolable> Deref for PoolVec<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T: Poolable> DerefMut for PoolVec<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T: Poolable + Clone> Clone for PoolVec<T> {
    fn clone(&self) -> Self {
        PoolVec::from_slice(&self.0)
    }
}

impl<T: Poolable + std::fmt::Debug> std::fmt::Debug for PoolVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Poolable + PartialEq> PartialEq for PoolVec<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<T: Poolable + PartialEq> PartialEq<Vec<T>> for PoolVec<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.0 == *other
    }
}

impl<T: Poolable> FromIterator<T> for PoolVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        PoolVec::collect(iter)
    }
}

/// Consuming iteration hands the buffer over (it is then freed, not recycled).
impl<T: Poolable> IntoIterator for PoolVec<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;
    fn into_iter(mut self) -> Self::IntoIter {
        std::mem::take(&mut self.0).into_iter()
    }
}

impl<'a, T: Poolable> IntoIterator for &'a PoolVec<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_with_their_capacity() {
        let cap = {
            let mut a: PoolVec<f32> = PoolVec::filled(1000, 1.5);
            a.push(2.0);
            a.capacity()
        };
        let b: PoolVec<f32> = PoolVec::new();
        assert!(b.is_empty());
        assert!(b.capacity() >= cap);
        let lists: PoolVec<PoolVec<i64>> = (0..3).map(|i| PoolVec::filled(4, i)).collect();
        assert_eq!(lists[2][..], [2, 2, 2, 2]);
    }
}
