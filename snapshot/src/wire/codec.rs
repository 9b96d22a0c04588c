//! How the description in [`super`] becomes code: the `wire!` macro
//! that generates each section's writer, reader, length, checks and
//! documentation, the [`Wire`] types fields are made of, and the
//! [`Reader`] that reads them.

use crate::{BudgetState, DrainReason, Error, Problem, MAX_NAME, MAX_WARM};
use alloc::string::String;
use alloc::vec::Vec;

/// What the description generates from: `wire! { report { sections }
/// budget(reading); }`.
///
/// A section is `BIT = value => slot(body);`: on the wire when `BIT` is
/// set in the report's `fields` byte, and held in `Report::slot`. Its
/// body is one value (`Type = "name" [=> check]`) or a struct's fields,
/// each `field: Type = "name" [if FLAG = value else Problem] [=> check]`,
/// in wire order. `name` is the field as errors and the crate
/// documentation name it; `Type` says how it is written ([`Wire`]);
/// `check` is a function of the value and its section that says what is
/// wrong with it. A field with a flag of its own is on the wire only when
/// it is not 0, with its flag set in the `fields` byte; the flag set
/// without its section is refused with `Problem`. A budget reading is a
/// struct's fields, as a section's.
macro_rules! wire {
    (
        report { $(
            $(#[doc = $doc:literal])*
            $bit:ident = $val:literal => $slot:ident ( $($body:tt)* );
        )* }
        $(#[doc = $bdoc:literal])*
        budget ( $($budget:tt)* );
    ) => {
        $( $(#[doc = $doc])* const $bit: u8 = $val; )*

        /// Each section's (and a budget reading's) writer, reader,
        /// length, checks and documentation.
        mod sections {
            use super::*;
            $( section! { $slot $($body)* } )*
            section! { budget $($budget)* }
        }

        /// Every bit a report's `fields` byte may set.
        const KNOWN: u8 = 0 $( | $bit | sections::$slot::FLAGS )*;

        /// A report's `fields` byte, then its sections.
        fn put_sections(r: &Report, out: &mut Vec<u8>) {
            let mut fields = 0;
            $( if let Some(v) = &r.$slot {
                fields |= $bit | sections::$slot::flags(v);
            } )*
            out.push(fields);
            $( if let Some(v) = &r.$slot {
                sections::$slot::put(v, out);
            } )*
        }

        /// The bytes of [`put_sections`].
        fn section_bytes(r: &Report) -> usize {
            1 $( + r.$slot.as_ref().map_or(0, sections::$slot::bytes) )*
        }

        /// A report's sections, as its `fields` byte says.
        fn get_sections(rd: &mut Reader<'_>, fields: u8, r: &mut Report) -> Result<(), Error> {
            $( if fields & $bit != 0 {
                r.$slot = Some(sections::$slot::get(rd, fields)?);
            } else {
                sections::$slot::orphan(rd, fields)?;
            } )*
            Ok(())
        }

        /// The checks on a report's sections: the field and problem of
        /// the first one wrong.
        fn check_sections(r: &Report) -> Result<(), (&'static str, Problem)> {
            $( if let Some(v) = &r.$slot {
                sections::$slot::check(v)?;
            } )*
            Ok(())
        }

        /// The sections as the crate documentation's table lists them,
        /// one line each (and one per field with a flag of its own).
        #[cfg(test)]
        fn documented() -> Vec<String> {
            let mut out = Vec::new();
            $( sections::$slot::document(concat!(stringify!($bit), " = ", $val), &mut out); )*
            out
        }

        /// A budget reading as the crate documentation lists it.
        #[cfg(test)]
        fn documented_budget() -> String {
            let mut out = Vec::new();
            sections::budget::document("", &mut out);
            String::from(out.concat().trim_start())
        }
    };
}

/// One section's (or a budget reading's) generated functions, in a module
/// named after its slot in [`Report`](crate::Report).
macro_rules! section {
    // A struct's fields.
    (
        $slot:ident $ty:ident {
            $( $field:ident : $fty:ty = $name:literal
               $(if $flag:ident = $fval:literal else $orphan:ident)?
               $(=> $check:path)? ),* $(,)?
        }
    ) => {
        #[allow(clippy::ptr_arg)]
        pub(super) mod $slot {
            use super::*;

            $($( const $flag: u8 = $fval; )?)*

            /// The bits of this section's fields with a flag of their own.
            #[allow(dead_code)]
            pub const FLAGS: u8 = 0 $($( | $flag )?)*;

            /// The fewest bytes it takes (its flagged fields absent).
            #[allow(dead_code)]
            pub const MIN: usize = 0 $( + field!(@min $fty $(, $flag)?) )*;

            /// The flags of `v`'s fields on the wire.
            #[allow(dead_code)]
            pub fn flags(v: &$ty) -> u8 {
                let _ = v;
                0 $($( | if v.$field != Default::default() { $flag } else { 0 } )?)*
            }

            pub fn put(v: &$ty, out: &mut Vec<u8>) {
                $( field!(@put v.$field, out $(, $flag)?); )*
            }

            pub fn bytes(v: &$ty) -> usize {
                0 $( + field!(@bytes v.$field $(, $flag)?) )*
            }

            pub fn get(r: &mut Reader<'_>, fields: u8) -> Result<$ty, Error> {
                let _ = fields;
                Ok($ty { $(
                    $field: field!(@get r, fields, $fty, $name $(, $flag)?),
                )* })
            }

            /// A flag set without this section: the value read (so an
            /// error names where it ends), then refused.
            #[allow(dead_code)]
            pub fn orphan(r: &mut Reader<'_>, fields: u8) -> Result<(), Error> {
                let _ = (&r, fields);
                $($( if fields & $flag != 0 {
                    <$fty as Wire>::get(r, field!(@field $name))?;
                    return Err(r.fail($name, Problem::$orphan));
                } )?)*
                Ok(())
            }

            pub fn check(v: &$ty) -> Result<(), (&'static str, Problem)> {
                $(
                    Wire::check(&v.$field, field!(@field $name))?;
                    $( $check(&v.$field, v).map_err(|p| ($name, p))?; )?
                )*
                Ok(())
            }

            /// Its line of the documentation's table under `bit`, and a
            /// line per flagged field.
            #[cfg(test)]
            pub fn document(bit: &str, out: &mut Vec<String>) {
                let mut fields: Vec<String> = Vec::new();
                $( field!(@doc fields, $name, <$fty as Wire>::DOC $(, $flag)?); )*
                out.push(alloc::format!("{bit:<12} {}", fields.join(", ")));
                $($( out.push(alloc::format!(
                    "{:<12} {} {} (only with {})",
                    concat!(stringify!($flag), " = ", $fval), $name, <$fty as Wire>::DOC,
                    bit.split(' ').next().unwrap_or(bit),
                )); )?)*
            }
        }
    };
    // One value.
    ($slot:ident $ty:ty = $name:literal $(=> $check:path)?) => {
        #[allow(clippy::ptr_arg)]
        pub(super) mod $slot {
            use super::*;

            pub const FLAGS: u8 = 0;

            pub fn flags(_: &$ty) -> u8 {
                0
            }

            pub fn put(v: &$ty, out: &mut Vec<u8>) {
                Wire::put(v, out);
            }

            pub fn bytes(v: &$ty) -> usize {
                Wire::bytes(v)
            }

            pub fn get(r: &mut Reader<'_>, _: u8) -> Result<$ty, Error> {
                <$ty as Wire>::get(r, field!(@field $name))
            }

            pub fn orphan(_: &mut Reader<'_>, _: u8) -> Result<(), Error> {
                Ok(())
            }

            pub fn check(v: &$ty) -> Result<(), (&'static str, Problem)> {
                Wire::check(v, field!(@field $name))?;
                $( $check(v, v).map_err(|p| ($name, p))?; )?
                Ok(())
            }

            #[cfg(test)]
            pub fn document(bit: &str, out: &mut Vec<String>) {
                out.push(alloc::format!("{bit:<12} {} {}", $name, <$ty as Wire>::DOC));
            }
        }
    };
}

/// One field of a struct section: its part of each generated function,
/// with a flag of its own or without.
macro_rules! field {
    (@field $name:literal) => {
        Field {
            name: $name,
            item: concat!($name, "[]"),
        }
    };
    (@min $fty:ty) => {
        <$fty as Wire>::MIN
    };
    (@min $fty:ty, $flag:ident) => {
        0
    };
    (@put $v:expr, $out:ident) => {
        Wire::put(&$v, $out)
    };
    (@put $v:expr, $out:ident, $flag:ident) => {
        if $v != Default::default() {
            Wire::put(&$v, $out)
        }
    };
    (@bytes $v:expr) => {
        Wire::bytes(&$v)
    };
    (@bytes $v:expr, $flag:ident) => {
        if $v != Default::default() {
            Wire::bytes(&$v)
        } else {
            0
        }
    };
    (@get $r:ident, $fields:ident, $fty:ty, $name:literal) => {
        <$fty as Wire>::get($r, field!(@field $name))?
    };
    (@get $r:ident, $fields:ident, $fty:ty, $name:literal, $flag:ident) => {
        if $fields & $flag != 0 {
            <$fty as Wire>::get($r, field!(@field $name))?
        } else {
            Default::default()
        }
    };
    (@doc $fields:ident, $name:literal, $doc:expr) => {
        $fields.push(alloc::format!("{} {}", $name, $doc))
    };
    (@doc $fields:ident, $name:literal, $doc:expr, $flag:ident) => {};
}
pub(super) use {field, section, wire};

/// A field's names: as errors and the documentation give it, and as they
/// give one item of it (a list's).
#[derive(Clone, Copy)]
pub(super) struct Field {
    pub(super) name: &'static str,
    pub(super) item: &'static str,
}

/// How a value of one type goes on the wire.
pub(super) trait Wire: Sized {
    /// The fewest bytes it takes.
    const MIN: usize;
    /// Its type, as the crate documentation's table writes it.
    #[cfg(test)]
    const DOC: &'static str;
    /// Append its bytes.
    fn put(&self, out: &mut Vec<u8>);
    /// How many bytes [`Wire::put`] appends.
    fn bytes(&self) -> usize;
    /// Read one, or fail naming `f`.
    fn get(r: &mut Reader<'_>, f: Field) -> Result<Self, Error>;
    /// What every value of the type must be, wherever it is (a name's
    /// length): the field and problem of the first thing wrong.
    fn check(&self, f: Field) -> Result<(), (&'static str, Problem)> {
        let _ = f;
        Ok(())
    }
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN: usize = core::mem::size_of::<$t>();
            #[cfg(test)]
            const DOC: &'static str = stringify!($t);
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn bytes(&self) -> usize {
                <Self as Wire>::MIN
            }
            fn get(r: &mut Reader<'_>, f: Field) -> Result<Self, Error> {
                r.take(f.name).map(<$t>::from_le_bytes)
            }
        }
    )*};
}
wire_int!(u16, u32, u64, f64);

/// `false` 0, `true` 1; any other byte is refused.
impl Wire for bool {
    const MIN: usize = 1;
    #[cfg(test)]
    const DOC: &'static str = "u8";
    fn put(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn bytes(&self) -> usize {
        1
    }
    fn get(r: &mut Reader<'_>, f: Field) -> Result<Self, Error> {
        match r.u8(f.name)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(r.fail(f.name, Problem::Reserved(u64::from(b)))),
        }
    }
}

/// An enumeration as its index in its `ALL` (wire order); any other byte
/// is refused.
macro_rules! wire_enum {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN: usize = 1;
            #[cfg(test)]
            const DOC: &'static str = "u8";
            fn put(&self, out: &mut Vec<u8>) {
                out.push(*self as u8);
            }
            fn bytes(&self) -> usize {
                1
            }
            fn get(r: &mut Reader<'_>, f: Field) -> Result<Self, Error> {
                let b = r.u8(f.name)?;
                <$t>::ALL
                    .get(usize::from(b))
                    .copied()
                    .ok_or_else(|| r.fail(f.name, Problem::Reserved(u64::from(b))))
            }
        }
    )*};
}
wire_enum!(DrainReason, BudgetState);

/// A name: its length (u16), then that many bytes of UTF-8; not empty,
/// at most [`MAX_NAME`] bytes.
impl Wire for String {
    const MIN: usize = 2;
    #[cfg(test)]
    const DOC: &'static str = "name";
    fn put(&self, out: &mut Vec<u8>) {
        name(out, self);
    }
    fn bytes(&self) -> usize {
        2 + self.len()
    }
    fn get(r: &mut Reader<'_>, f: Field) -> Result<Self, Error> {
        r.name(f.name)
    }
    fn check(&self, f: Field) -> Result<(), (&'static str, Problem)> {
        check_name(self).map_err(|p| (f.name, p))
    }
}

/// A list of names (the warm models): their count (u16, at most
/// [`MAX_WARM`]), then each name.
impl Wire for Vec<String> {
    const MIN: usize = 2;
    #[cfg(test)]
    const DOC: &'static str = "u16, then that many names";
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.len() as u16).to_le_bytes());
        for m in self {
            name(out, m);
        }
    }
    fn bytes(&self) -> usize {
        2 + self.iter().map(|m| 2 + m.len()).sum::<usize>()
    }
    fn get(r: &mut Reader<'_>, f: Field) -> Result<Self, Error> {
        let n = usize::from(r.u16(f.name)?);
        if n > MAX_WARM {
            let (found, max) = (n as u64, MAX_WARM as u64);
            return Err(r.fail(f.name, Problem::TooLarge { found, max }));
        }
        let mut names = Vec::with_capacity(n);
        for _ in 0..n {
            names.push(r.name(f.item)?);
        }
        Ok(names)
    }
    fn check(&self, f: Field) -> Result<(), (&'static str, Problem)> {
        if self.len() > MAX_WARM {
            let (found, max) = (self.len() as u64, MAX_WARM as u64);
            return Err((f.name, Problem::TooLarge { found, max }));
        }
        for m in self {
            check_name(m).map_err(|p| (f.item, p))?;
        }
        Ok(())
    }
}

/// Append name `s`: its length (u16), then its bytes.
pub(super) fn name(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// What every name must be: not empty, at most [`MAX_NAME`] bytes.
pub(super) fn check_name(name: &str) -> Result<(), Problem> {
    if name.is_empty() {
        return Err(Problem::Empty);
    }
    if name.len() > MAX_NAME {
        return Err(Problem::TooLarge {
            found: name.len() as u64,
            max: MAX_NAME as u64,
        });
    }
    Ok(())
}

/// A cursor over the snapshot's body that fails, never panics, at its end.
pub(super) struct Reader<'a> {
    /// The snapshot's body (its checksum taken off).
    pub(super) buf: &'a [u8],
    /// Where the next field starts.
    pub(super) at: usize,
    /// The report (or budget reading) being read, by index and, once
    /// read, name: errors name it.
    pub(super) report: Option<(usize, Option<String>)>,
}

impl Reader<'_> {
    pub(super) fn fail(&self, field: &'static str, problem: Problem) -> Error {
        Error {
            at: self.at,
            destination: self.report.clone(),
            field,
            problem,
        }
    }

    pub(super) fn take<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], Error> {
        let bytes = self
            .at
            .checked_add(N)
            .and_then(|end| self.buf.get(self.at..end))
            .and_then(|b| <[u8; N]>::try_from(b).ok())
            .ok_or_else(|| self.fail(field, Problem::Truncated))?;
        self.at += N;
        Ok(bytes)
    }

    pub(super) fn u8(&mut self, field: &'static str) -> Result<u8, Error> {
        self.take::<1>(field).map(|[b]| b)
    }

    pub(super) fn u16(&mut self, field: &'static str) -> Result<u16, Error> {
        self.take(field).map(u16::from_le_bytes)
    }

    pub(super) fn u32(&mut self, field: &'static str) -> Result<u32, Error> {
        self.take(field).map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self, field: &'static str) -> Result<u64, Error> {
        self.take(field).map(u64::from_le_bytes)
    }

    pub(super) fn name(&mut self, field: &'static str) -> Result<String, Error> {
        let len = usize::from(self.u16(field)?);
        if len > MAX_NAME {
            let found = len as u64;
            let max = MAX_NAME as u64;
            return Err(self.fail(field, Problem::TooLarge { found, max }));
        }
        let bytes = self
            .buf
            .get(self.at..self.at + len)
            .ok_or_else(|| self.fail(field, Problem::Truncated))?;
        let s = core::str::from_utf8(bytes).map_err(|_| self.fail(field, Problem::NotUtf8))?;
        self.at += len;
        // An item's first name is its own: later errors name it.
        if let Some((_, named @ None)) = &mut self.report {
            *named = Some(String::from(s));
        }
        Ok(String::from(s))
    }
}
