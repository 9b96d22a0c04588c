//! The stored record of one event: what was logged plus the ledger's own
//! figures, in one flat shape that both stores hold column for column.
//!
//! The row, its column list and the conversions to and from untyped
//! column values are derived here from the event's one definition
//! (`ace_event::event_fields!`, each field typed by its [`crate::kind`]),
//! so SQLite and PostgreSQL cannot drift apart, and a new event field is
//! a new column with no change here.

use crate::event::Event;
use crate::kind::{need, Cols, Val};
use crate::money::Nano;
use crate::price::{self, Priced};

/// The row's struct, columns and conversions: one per entry of
/// `ace_event::event_fields!`, typed by its kind ([`crate::kind`]), then
/// the ledger's own figures.
macro_rules! row {
    ($( $(#[doc = $doc:literal])* $name:ident : $fty:ty $(, via $via:ident)? => $kind:ident, $presence:ident; )*) => {
        /// One booked event: what was logged (the fields of
        /// `ace_event::event_fields!`), then the ledger's own figures.
        #[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
        pub struct Row {
            $( $(#[doc = $doc])* pub $name: <$crate::kind::$kind as $crate::kind::Kind>::Stored, )*
            /// The ledger's true marginal cost.
            pub booked: Nano,
            /// Cheapest feasible pay-as-you-go, model asked for.
            pub counterfactual: Option<Nano>,
            /// Cheapest feasible pay-as-you-go, model served.
            pub served_counterfactual: Option<Nano>,
            /// The filter's figures that disagree with the ledger's, and
            /// [`CONFLICT_FLAG`] on an event booked apart because another
            /// event held its id (comma-separated).
            pub flags: String,
        }

        /// How many columns a row has.
        pub const COLUMN_COUNT: usize = [$(stringify!($name)),*].len() + 4;

        /// The columns, in order, with their SQL types (valid in SQLite and
        /// PostgreSQL alike), and the value each takes in rows stored
        /// before it was added.
        pub const COLUMNS: [(&str, &str); COLUMN_COUNT] = [
            $( (column!($name), <$crate::kind::$kind as $crate::kind::Kind>::SQL), )*
            ("booked_nano", "BIGINT NOT NULL"),
            ("counterfactual_nano", "BIGINT"),
            ("served_counterfactual_nano", "BIGINT"),
            ("flags", "TEXT NOT NULL"),
        ];

        /// The value each column takes in rows stored before it was added
        /// (SQL), in [`COLUMNS`] order.
        pub const EMPTY: [&str; COLUMN_COUNT] = [
            $( <$crate::kind::$kind as $crate::kind::Kind>::EMPTY, )*
            "0", "NULL", "NULL", "''",
        ];

        impl Row {
            /// What event `e` logged, with none of the ledger's figures.
            fn logged_by(e: Event) -> Row {
                Row {
                    $( $name: <$crate::kind::$kind as $crate::kind::Kind>::stored(e.$name), )*
                    booked: 0,
                    counterfactual: None,
                    served_counterfactual: None,
                    flags: String::new(),
                }
            }

            /// The column values, in [`COLUMNS`] order.
            pub fn values(&self) -> [Val; COLUMN_COUNT] {
                [
                    $( <$crate::kind::$kind as $crate::kind::Kind>::val(&self.$name), )*
                    Val::Int(Some(self.booked)),
                    Val::Int(self.counterfactual),
                    Val::Int(self.served_counterfactual),
                    Val::Text(Some(self.flags.clone())),
                ]
            }

            /// Read a row back from its columns.
            pub fn read(c: &dyn Cols) -> anyhow::Result<Row> {
                let mut i = 0;
                $(
                    let $name = <$crate::kind::$kind as $crate::kind::Kind>::get(c, i, column_name(i))?;
                    i += 1;
                )*
                Ok(Row {
                    $( $name, )*
                    booked: need(c.int(i)?, column_name(i))?,
                    counterfactual: c.int(i + 1)?,
                    served_counterfactual: c.int(i + 2)?,
                    flags: need(c.text(i + 3)?, column_name(i + 3))?,
                })
            }
        }
    };
}

/// A field's column: its name, but for the two the store named before the
/// fields were defined in one place.
macro_rules! column {
    (marginal_usd) => {
        "filter_marginal_nano"
    };
    (counterfactual_usd) => {
        "filter_counterfactual_nano"
    };
    ($name:ident) => {
        stringify!($name)
    };
}

ace_event::event_fields!(row);

/// The flag of a row booked under a derived id because a different event
/// was stored under its `event_id` first (see `ingest`).
pub const CONFLICT_FLAG: &str = "event_id_conflict";

/// Column `i`'s name, for an error.
fn column_name(i: usize) -> &'static str {
    COLUMNS.get(i).map_or("?", |c| c.0)
}

impl Row {
    /// The row for event `e` priced `p` under configuration `config`.
    pub fn new(e: Event, config: String, p: Priced) -> Row {
        let flags = price::disagreements(&e, &p);
        Row {
            config,
            booked: p.booked,
            counterfactual: p.counterfactual,
            served_counterfactual: p.served_counterfactual,
            flags,
            ..Row::logged_by(e)
        }
    }

    /// This row without the ledger's own figures (booked cost,
    /// counterfactuals, flags): what the line said, as the ingest read it.
    /// Two rows are the same event when these agree, so ingesting a log
    /// again after the ledger's pricing changed is still idempotent.
    pub fn logged(&self) -> Row {
        Row {
            booked: 0,
            counterfactual: None,
            served_counterfactual: None,
            flags: String::new(),
            ..self.clone()
        }
    }

    /// Whether the filter's logged figures disagree with the ledger's.
    pub fn disagrees(&self) -> bool {
        self.flags
            .split(',')
            .any(|f| !f.is_empty() && f != CONFLICT_FLAG)
    }

    /// Whether this row was booked apart from another event that holds its
    /// logged `event_id`.
    pub fn conflicted(&self) -> bool {
        self.flags.split(',').any(|f| f == CONFLICT_FLAG)
    }

    /// Whether the request was served ([`ace_pricing::served`]). Only
    /// served requests earn savings.
    pub fn served(&self) -> bool {
        ace_pricing::served(
            self.destination.is_some(),
            self.cached,
            u32::try_from(self.status).unwrap_or(u32::MAX),
        )
    }
}
