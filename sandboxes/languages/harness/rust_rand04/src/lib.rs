//! rand 0.4's API over rand 0.8.5 (Debian's only rand): HumanEvalPack's Rust harness pinned `rand = "0.4"`, and its
//! tests call `rng.gen_range(low, high)`, `rng.gen()`, `rand::thread_rng()` and `rand::random::<u32>()`. The names
//! and signatures are 0.4.6's (trait `Rng` with its provided methods, `Rand`, `distributions::{Range, Sample,
//! IndependentSample}`, `ThreadRng`, `StdRng`, `OsRng`, `XorShiftRng`, `SeedableRng`, `random`, `weak_rng`,
//! `sample`); the bits come from rand 0.8's generators (ThreadRng, StdRng, OsRng), so a seeded StdRng's stream differs
//! from 0.4's ISAAC. What 0.4 lacked (`gen_bool`, ranges as `gen_range`'s argument) is absent here too, so an answer
//! compiles here exactly when it would against the reference's rand.
#![forbid(unsafe_code)]

use rand08::distributions::Distribution;
use rand08::{RngCore as _, SeedableRng as _};
use std::marker::PhantomData;

/// Lets rand 0.8's distributions draw from any 0.4 `Rng`.
struct Bridge<'a, R: ?Sized>(&'a mut R);

impl<'a, R: Rng + ?Sized> rand08::RngCore for Bridge<'a, R> {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill_bytes(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand08::Error> {
        self.0.fill_bytes(dest);
        Ok(())
    }
}

/// A random number generator (rand 0.4's trait: `next_u32` is required, the rest provided).
pub trait Rng {
    fn next_u32(&mut self) -> u32;

    fn next_u64(&mut self) -> u64 {
        ((self.next_u32() as u64) << 32) | (self.next_u32() as u64)
    }

    fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 24) as f32
    }

    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    fn gen<T: Rand>(&mut self) -> T
    where
        Self: Sized,
    {
        Rand::rand(self)
    }

    fn gen_iter<'a, T: Rand>(&'a mut self) -> Generator<'a, T, Self>
    where
        Self: Sized,
    {
        Generator { rng: self, _marker: PhantomData }
    }

    fn gen_range<T: PartialOrd + distributions::range::SampleRange>(&mut self, low: T, high: T) -> T
    where
        Self: Sized,
    {
        assert!(low < high, "Rng.gen_range called with low >= high");
        distributions::IndependentSample::ind_sample(&distributions::Range::new(low, high), self)
    }

    fn gen_weighted_bool(&mut self, n: u32) -> bool
    where
        Self: Sized,
    {
        n <= 1 || self.gen_range(0, n) == 0
    }

    fn gen_ascii_chars<'a>(&'a mut self) -> AsciiGenerator<'a, Self>
    where
        Self: Sized,
    {
        AsciiGenerator { rng: self }
    }

    fn choose<'a, T>(&mut self, values: &'a [T]) -> Option<&'a T>
    where
        Self: Sized,
    {
        if values.is_empty() {
            None
        } else {
            Some(&values[self.gen_range(0, values.len())])
        }
    }

    fn choose_mut<'a, T>(&mut self, values: &'a mut [T]) -> Option<&'a mut T>
    where
        Self: Sized,
    {
        if values.is_empty() {
            None
        } else {
            let len = values.len();
            Some(&mut values[self.gen_range(0, len)])
        }
    }

    fn shuffle<T>(&mut self, values: &mut [T])
    where
        Self: Sized,
    {
        let mut i = values.len();
        while i >= 2 {
            i -= 1;
            values.swap(i, self.gen_range(0, i + 1));
        }
    }
}

impl<'a, R: Rng + ?Sized> Rng for &'a mut R {
    fn next_u32(&mut self) -> u32 {
        (**self).next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        (**self).fill_bytes(dest)
    }
}

impl<R: Rng + ?Sized> Rng for Box<R> {
    fn next_u32(&mut self) -> u32 {
        (**self).next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        (**self).fill_bytes(dest)
    }
}

/// Types a `Rng` can make (`rng.gen()`, `rand::random()`).
pub trait Rand: Sized {
    fn rand<R: Rng>(rng: &mut R) -> Self;
}

macro_rules! rand_standard {
    ($($t:ty)*) => {$(
        impl Rand for $t {
            fn rand<R: Rng>(rng: &mut R) -> $t {
                rand08::distributions::Standard.sample(&mut Bridge(rng))
            }
        }
    )*};
}
rand_standard!(u8 u16 u32 u64 usize i8 i16 i32 i64 isize f32 f64 bool char);

impl Rand for () {
    fn rand<R: Rng>(_: &mut R) {}
}

impl<T: Rand> Rand for Option<T> {
    fn rand<R: Rng>(rng: &mut R) -> Option<T> {
        if rng.gen() {
            Some(rng.gen())
        } else {
            None
        }
    }
}

macro_rules! rand_tuple {
    ($($name:ident)+) => {
        impl<$($name: Rand),+> Rand for ($($name,)+) {
            fn rand<R: Rng>(rng: &mut R) -> ($($name,)+) {
                ($(rng.gen::<$name>(),)+)
            }
        }
    };
}
rand_tuple!(A);
rand_tuple!(A B);
rand_tuple!(A B C);
rand_tuple!(A B C D);
rand_tuple!(A B C D E);
rand_tuple!(A B C D E F);

macro_rules! rand_array {
    ($($n:expr)*) => {$(
        impl<T: Rand> Rand for [T; $n] {
            fn rand<R: Rng>(rng: &mut R) -> [T; $n] {
                [(); $n].map(|_| rng.gen())
            }
        }
    )*};
}
rand_array!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);

/// `rng.gen_iter()`: an endless iterator of random values.
pub struct Generator<'a, T, R: 'a> {
    rng: &'a mut R,
    _marker: PhantomData<fn() -> T>,
}

impl<'a, T: Rand, R: Rng> Iterator for Generator<'a, T, R> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        Some(self.rng.gen())
    }
}

/// `rng.gen_ascii_chars()`: an endless iterator of characters from A-Z, a-z and 0-9.
pub struct AsciiGenerator<'a, R: 'a> {
    rng: &'a mut R,
}

impl<'a, R: Rng> Iterator for AsciiGenerator<'a, R> {
    type Item = char;
    fn next(&mut self) -> Option<char> {
        const CHARSET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        Some(*self.rng.choose(CHARSET).unwrap() as char)
    }
}

pub mod distributions {
    //! rand 0.4's `Sample`, `IndependentSample` and `Range` (uniform over `[low, high)`).
    pub use self::range::Range;
    use super::Rng;

    pub trait Sample<Support> {
        fn sample<R: Rng>(&mut self, rng: &mut R) -> Support;
    }

    pub trait IndependentSample<Support>: Sample<Support> {
        fn ind_sample<R: Rng>(&self, rng: &mut R) -> Support;
    }

    pub mod range {
        use super::super::{Bridge, Rng};
        use super::{IndependentSample, Sample};

        /// Uniform over `[low, high)`.
        #[derive(Clone, Copy, Debug)]
        pub struct Range<X> {
            low: X,
            high: X,
        }

        impl<X: SampleRange + PartialOrd> Range<X> {
            pub fn new(low: X, high: X) -> Range<X> {
                assert!(low < high, "Range::new called with `low >= high`");
                SampleRange::construct_range(low, high)
            }
        }

        impl<Sup: SampleRange> Sample<Sup> for Range<Sup> {
            fn sample<R: Rng>(&mut self, rng: &mut R) -> Sup {
                self.ind_sample(rng)
            }
        }

        impl<Sup: SampleRange> IndependentSample<Sup> for Range<Sup> {
            fn ind_sample<R: Rng>(&self, rng: &mut R) -> Sup {
                SampleRange::sample_range(self, rng)
            }
        }

        /// The types `gen_range` and `Range` take: the primitive integers and floats.
        pub trait SampleRange: Sized {
            fn construct_range(low: Self, high: Self) -> Range<Self>;
            fn sample_range<R: Rng>(r: &Range<Self>, rng: &mut R) -> Self;
        }

        macro_rules! sample_range {
            ($($t:ty)*) => {$(
                impl SampleRange for $t {
                    fn construct_range(low: $t, high: $t) -> Range<$t> {
                        Range { low, high }
                    }
                    fn sample_range<R: Rng>(r: &Range<$t>, rng: &mut R) -> $t {
                        rand08::Rng::gen_range(&mut Bridge(rng), r.low..r.high)
                    }
                }
            )*};
        }
        sample_range!(u8 u16 u32 u64 usize i8 i16 i32 i64 isize f32 f64);
    }
}

/// Generators made from a seed (0.4's trait, generic over the seed's type).
pub trait SeedableRng<Seed>: Rng {
    fn reseed(&mut self, seed: Seed);
    fn from_seed(seed: Seed) -> Self;
}

/// The thread's generator (`rand::thread_rng()`): rand 0.8's ThreadRng.
#[derive(Clone, Debug)]
pub struct ThreadRng {
    inner: rand08::rngs::ThreadRng,
}

pub fn thread_rng() -> ThreadRng {
    ThreadRng { inner: rand08::thread_rng() }
}

impl Rng for ThreadRng {
    fn next_u32(&mut self) -> u32 {
        self.inner.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.inner.fill_bytes(dest)
    }
}

/// A random value from the thread's generator.
pub fn random<T: Rand>() -> T {
    thread_rng().gen()
}

/// The operating system's generator.
#[derive(Clone, Debug)]
pub struct OsRng {
    inner: rand08::rngs::OsRng,
}

impl OsRng {
    pub fn new() -> std::io::Result<OsRng> {
        Ok(OsRng { inner: rand08::rngs::OsRng })
    }
}

impl Rng for OsRng {
    fn next_u32(&mut self) -> u32 {
        self.inner.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.inner.fill_bytes(dest)
    }
}

/// The standard generator: rand 0.8's StdRng behind 0.4's `new()` and `&[usize]` seed.
#[derive(Clone, Debug)]
pub struct StdRng {
    inner: rand08::rngs::StdRng,
}

impl StdRng {
    pub fn new() -> std::io::Result<StdRng> {
        Ok(StdRng { inner: rand08::rngs::StdRng::from_entropy() })
    }
}

impl Rng for StdRng {
    fn next_u32(&mut self) -> u32 {
        self.inner.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.inner.fill_bytes(dest)
    }
}

impl<'a> SeedableRng<&'a [usize]> for StdRng {
    fn reseed(&mut self, seed: &'a [usize]) {
        *self = SeedableRng::from_seed(seed);
    }
    fn from_seed(seed: &'a [usize]) -> StdRng {
        let mut bytes = [0u8; 32];
        for (i, word) in seed.iter().enumerate() {
            for (j, b) in word.to_le_bytes().iter().enumerate() {
                bytes[(i * 8 + j) % 32] ^= *b;
            }
        }
        StdRng { inner: rand08::rngs::StdRng::from_seed(bytes) }
    }
}

/// Marsaglia's xorshift128 (0.4's `XorShiftRng`, same algorithm and seeds).
#[derive(Clone, Debug)]
pub struct XorShiftRng {
    x: u32,
    y: u32,
    z: u32,
    w: u32,
}

impl XorShiftRng {
    pub fn new_unseeded() -> XorShiftRng {
        XorShiftRng { x: 0x193a6754, y: 0xa8a7d469, z: 0x97830e05, w: 0x113ba7bb }
    }
}

impl Rng for XorShiftRng {
    fn next_u32(&mut self) -> u32 {
        let t = self.x ^ (self.x << 11);
        self.x = self.y;
        self.y = self.z;
        self.z = self.w;
        self.w = self.w ^ (self.w >> 19) ^ (t ^ (t >> 8));
        self.w
    }
}

impl SeedableRng<[u32; 4]> for XorShiftRng {
    fn reseed(&mut self, seed: [u32; 4]) {
        *self = SeedableRng::from_seed(seed);
    }
    fn from_seed(seed: [u32; 4]) -> XorShiftRng {
        assert!(!seed.iter().all(|&x| x == 0), "XorShiftRng.from_seed called with an all zero seed.");
        XorShiftRng { x: seed[0], y: seed[1], z: seed[2], w: seed[3] }
    }
}

impl Rand for XorShiftRng {
    fn rand<R: Rng>(rng: &mut R) -> XorShiftRng {
        let mut seed: [u32; 4] = rng.gen();
        while seed.iter().all(|&x| x == 0) {
            seed = rng.gen();
        }
        SeedableRng::from_seed(seed)
    }
}

/// A fast generator seeded from the thread's (0.4's `weak_rng`).
pub fn weak_rng() -> XorShiftRng {
    thread_rng().gen()
}

/// `amount` values chosen at random from `iterable` (reservoir sampling, in no particular order).
pub fn sample<T, I, R>(rng: &mut R, iterable: I, amount: usize) -> Vec<T>
where
    I: IntoIterator<Item = T>,
    R: Rng,
{
    let mut iter = iterable.into_iter();
    let mut reservoir: Vec<T> = iter.by_ref().take(amount).collect();
    for (i, elem) in iter.enumerate() {
        let k = rng.gen_range(0, i + 1 + amount);
        if let Some(slot) = reservoir.get_mut(k) {
            *slot = elem;
        }
    }
    reservoir
}
