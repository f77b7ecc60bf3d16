//! A small, safe unpickler for PyTorch memory snapshots: it builds plain values and never runs
//! code. Only the opcodes a snapshot uses are accepted (protocols 2–5: containers, strings,
//! integers, floats, booleans, None, the memo); GLOBAL, REDUCE, BUILD and every other opcode are
//! refused. Hostile input is bounded: lengths are checked against the bytes that remain, integers
//! are capped at 128 bits, container nesting at [`MAX_DEPTH`], and values at the input's size.
//! (`serde-pickle` cannot read real snapshots: they share frame lists between entries.)

use std::cell::{Cell, RefCell};
use std::rc::Rc;

pub const MAX_DEPTH: u32 = 64;

#[derive(Debug, Clone)]
pub enum Value {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    Tuple(Rc<Vec<Value>>),
    List(Rc<Container<Vec<Value>>>),
    Dict(Rc<Container<Vec<(Value, Value)>>>),
}

/// A mutable container, shared through the memo, with its nesting depth.
#[derive(Debug)]
pub struct Container<T> {
    pub items: RefCell<T>,
    depth: Cell<u32>,
}

impl<T> Container<T> {
    fn new(items: T) -> Rc<Self> {
        Rc::new(Container { items: RefCell::new(items), depth: Cell::new(1) })
    }
}

impl Value {
    fn depth(&self) -> u32 {
        match self {
            Value::List(c) => c.depth.get(),
            Value::Dict(c) => c.depth.get(),
            Value::Tuple(t) => 1 + t.iter().map(Value::depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        if let Value::Str(s) = self {
            Some(s)
        } else {
            None
        }
    }

    pub fn as_int(&self) -> Option<i128> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i128),
            _ => None,
        }
    }

    /// Looks a string key up in a dict.
    pub fn get(&self, key: &str) -> Option<Value> {
        if let Value::Dict(d) = self {
            d.items.borrow().iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v.clone())
        } else {
            None
        }
    }

    /// What kind of value this is, as Python names it (for error messages).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) => "an int",
            Value::Float(_) => "a float",
            Value::Str(_) => "a str",
            Value::Bytes(_) => "bytes",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
        }
    }

    /// The first `n` items of a list or tuple (without copying the rest).
    pub fn items_prefix(&self, n: usize) -> Option<Vec<Value>> {
        match self {
            Value::List(l) => Some(l.items.borrow().iter().take(n).cloned().collect()),
            Value::Tuple(t) => Some(t.iter().take(n).cloned().collect()),
            _ => None,
        }
    }

    /// The items of a list or tuple.
    pub fn items(&self) -> Option<Vec<Value>> {
        match self {
            Value::List(l) => Some(l.items.borrow().clone()),
            Value::Tuple(t) => Some(t.as_ref().clone()),
            _ => None,
        }
    }

    /// The same value from JSON (a snapshot dict written with `json.dump`): objects become dicts
    /// with string keys, arrays lists, integers that fit 128 bits ints, other numbers floats.
    /// (Nesting is bounded by serde_json's recursion limit; `depth` bounds only the unpickler.)
    pub fn from_json(v: &serde_json::Value) -> Value {
        match v {
            serde_json::Value::Null => Value::None,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Value::Int(i as i128),
                (None, Some(u)) => Value::Int(u as i128),
                // serde_json reads an integer past 64 bits (Python's json writes 2**70 as digits)
                // as a float: it is an integer all the same, too big for what it sizes (i128
                // saturates).
                _ => match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() >= 2f64.powi(63) => Value::Int(f as i128),
                    f => Value::Float(f.unwrap_or(f64::NAN)),
                },
            },
            serde_json::Value::String(s) => Value::Str(Rc::from(s.as_str())),
            serde_json::Value::Array(items) => Value::List(Container::new(items.iter().map(Value::from_json).collect())),
            serde_json::Value::Object(map) => {
                Value::Dict(Container::new(map.iter().map(|(k, v)| (Value::Str(Rc::from(k.as_str())), Value::from_json(v))).collect()))
            }
        }
    }

    /// Identity of a shared container (for interning shared frame lists).
    pub fn ptr_id(&self) -> Option<usize> {
        match self {
            Value::List(l) => Some(Rc::as_ptr(l) as *const u8 as usize),
            Value::Tuple(t) => Some(Rc::as_ptr(t) as *const u8 as usize),
            _ => None,
        }
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.data.len() - self.pos {
            return Err(format!("truncated pickle: {n} bytes needed at offset {}, {} left", self.pos, self.data.len() - self.pos));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn le(&mut self, n: usize) -> Result<u64, String> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }
}

fn signed_le(bytes: &[u8]) -> Result<i128, String> {
    if bytes.len() > 16 {
        return Err(format!("integer of {} bytes is too large", bytes.len()));
    }
    if bytes.is_empty() {
        return Ok(0);
    }
    let mut v: i128 = 0;
    for (i, &b) in bytes.iter().enumerate() {
        v |= (b as i128) << (8 * i);
    }
    let bits = 8 * bytes.len();
    if bits < 128 && bytes[bytes.len() - 1] & 0x80 != 0 {
        v -= 1i128 << bits;
    }
    Ok(v)
}

/// Parses a pickle into a value. Errors say what was wrong and at which offset.
pub fn parse(data: &[u8]) -> Result<Value, String> {
    let mut r = Reader { data, pos: 0 };
    let mut stack: Vec<Value> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: Vec<Option<Value>> = Vec::new();
    let max_items = data.len();
    let str_of = |b: &[u8], at: usize| -> Result<Value, String> {
        std::str::from_utf8(b).map(|s| Value::Str(Rc::from(s))).map_err(|_| format!("invalid UTF-8 string at offset {at}"))
    };
    let pop = |stack: &mut Vec<Value>, at: usize| stack.pop().ok_or_else(|| format!("stack underflow at offset {at}"));
    let pop_mark = |stack: &mut Vec<Value>, marks: &mut Vec<usize>, at: usize| -> Result<Vec<Value>, String> {
        let m = marks.pop().ok_or_else(|| format!("no MARK for the opcode at offset {at}"))?;
        if m > stack.len() {
            return Err(format!("corrupt MARK at offset {at}"));
        }
        Ok(stack.split_off(m))
    };
    let check_depth = |child: &Value, parent_depth: &Cell<u32>, at: usize| -> Result<(), String> {
        let d = child.depth() + 1;
        if d > MAX_DEPTH {
            return Err(format!("containers nested deeper than {MAX_DEPTH} at offset {at}"));
        }
        parent_depth.set(parent_depth.get().max(d));
        Ok(())
    };
    let set_memo = |memo: &mut Vec<Option<Value>>, idx: usize, v: Value, at: usize| -> Result<(), String> {
        if idx > max_items {
            return Err(format!("memo index {idx} out of range at offset {at}"));
        }
        if memo.len() <= idx {
            memo.resize(idx + 1, None);
        }
        memo[idx] = Some(v);
        Ok(())
    };
    loop {
        let at = r.pos;
        let op = r.u8()?;
        if stack.len() > max_items {
            return Err("pickle builds more values than it has bytes".into());
        }
        match op {
            0x80 => {
                let proto = r.u8()?;
                if !(2..=5).contains(&proto) {
                    return Err(format!("unsupported pickle protocol {proto}"));
                }
            }
            0x95 => {
                r.le(8)?; // FRAME: a length hint only
            }
            b'.' => return pop(&mut stack, at),
            b'(' => marks.push(stack.len()),
            b'}' => stack.push(Value::Dict(Container::new(Vec::new()))),
            b']' => stack.push(Value::List(Container::new(Vec::new()))),
            b')' => stack.push(Value::Tuple(Rc::new(Vec::new()))),
            b't' => {
                let items = pop_mark(&mut stack, &mut marks, at)?;
                stack.push(Value::Tuple(Rc::new(items)));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n {
                    return Err(format!("stack underflow at offset {at}"));
                }
                let items = stack.split_off(stack.len() - n);
                stack.push(Value::Tuple(Rc::new(items)));
            }
            b'l' => {
                let items = pop_mark(&mut stack, &mut marks, at)?;
                let c = Container::new(Vec::new());
                for v in &items {
                    check_depth(v, &c.depth, at)?;
                }
                *c.items.borrow_mut() = items;
                stack.push(Value::List(c));
            }
            b'd' => {
                let items = pop_mark(&mut stack, &mut marks, at)?;
                if items.len() % 2 != 0 {
                    return Err(format!("odd number of items for DICT at offset {at}"));
                }
                let c = Container::new(Vec::new());
                let mut pairs = Vec::with_capacity(items.len() / 2);
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    check_depth(&v, &c.depth, at)?;
                    pairs.push((k, v));
                }
                *c.items.borrow_mut() = pairs;
                stack.push(Value::Dict(c));
            }
            b'a' | b'e' => {
                let items = if op == b'a' { vec![pop(&mut stack, at)?] } else { pop_mark(&mut stack, &mut marks, at)? };
                match stack.last() {
                    Some(Value::List(l)) => {
                        for v in &items {
                            check_depth(v, &l.depth, at)?;
                        }
                        l.items.borrow_mut().extend(items);
                    }
                    _ => return Err(format!("APPEND to a non-list at offset {at}")),
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = pop(&mut stack, at)?;
                    let k = pop(&mut stack, at)?;
                    vec![k, v]
                } else {
                    pop_mark(&mut stack, &mut marks, at)?
                };
                if items.len() % 2 != 0 {
                    return Err(format!("odd number of items for SETITEMS at offset {at}"));
                }
                match stack.last() {
                    Some(Value::Dict(d)) => {
                        let mut it = items.into_iter();
                        while let (Some(k), Some(v)) = (it.next(), it.next()) {
                            check_depth(&v, &d.depth, at)?;
                            d.items.borrow_mut().push((k, v));
                        }
                    }
                    _ => return Err(format!("SETITEM on a non-dict at offset {at}")),
                }
            }
            b'N' => stack.push(Value::None),
            0x88 => stack.push(Value::Bool(true)),
            0x89 => stack.push(Value::Bool(false)),
            b'J' => stack.push(Value::Int(r.le(4)? as u32 as i32 as i128)),
            b'K' => stack.push(Value::Int(r.le(1)? as i128)),
            b'M' => stack.push(Value::Int(r.le(2)? as i128)),
            0x8a | 0x8b => {
                let n = if op == 0x8a { r.le(1)? } else { r.le(4)? } as usize;
                let bytes = r.take(n)?;
                stack.push(Value::Int(signed_le(bytes)?));
            }
            b'G' => {
                let b = r.take(8)?;
                stack.push(Value::Float(f64::from_be_bytes(b.try_into().expect("8 bytes"))));
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => r.le(1)?,
                    b'X' => r.le(4)?,
                    _ => r.le(8)?,
                } as usize;
                let b = r.take(n)?;
                stack.push(str_of(b, at)?);
            }
            b'C' | b'B' | 0x8e => {
                let n = match op {
                    b'C' => r.le(1)?,
                    b'B' => r.le(4)?,
                    _ => r.le(8)?,
                } as usize;
                stack.push(Value::Bytes(Rc::from(r.take(n)?)));
            }
            0x94 => {
                let v = stack.last().cloned().ok_or_else(|| format!("MEMOIZE on an empty stack at offset {at}"))?;
                let idx = memo.len();
                set_memo(&mut memo, idx, v, at)?;
            }
            b'q' | b'r' => {
                let idx = if op == b'q' { r.le(1)? } else { r.le(4)? } as usize;
                let v = stack.last().cloned().ok_or_else(|| format!("PUT on an empty stack at offset {at}"))?;
                set_memo(&mut memo, idx, v, at)?;
            }
            b'h' | b'j' => {
                let idx = if op == b'h' { r.le(1)? } else { r.le(4)? } as usize;
                let v = memo.get(idx).cloned().flatten().ok_or_else(|| format!("memo entry {idx} is not defined (offset {at})"))?;
                stack.push(v);
            }
            b'c' | 0x93 | b'R' | b'b' | b'i' | b'o' | 0x81 | 0x92 | b'P' | b'Q' => {
                return Err(format!("opcode {:#04x} at offset {at} would import or call code: not a memory snapshot", op));
            }
            other => return Err(format!("unsupported pickle opcode {other:#04x} at offset {at}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_protocol_2_and_4_basics_with_memo() {
        // pickle.dumps({'a': [1, -2, 3.5, None, True], 'b': 'x'*3, 'c': 2**40}, protocol=4), by hand:
        let mut p = vec![0x80, 4, b'}', 0x94, b'(', 0x8c, 1, b'a', 0x94, b']', 0x94, b'(', b'K', 1, b'J'];
        p.extend((-2i32).to_le_bytes());
        p.push(b'G');
        p.extend(3.5f64.to_be_bytes());
        p.extend([b'N', 0x88, b'e', 0x8c, 1, b'b', 0x8c, 3, b'x', b'x', b'x', 0x8c, 1, b'c', 0x8a, 6, 0, 0, 0, 0, 0, 1, b'u', b'.']);
        let v = parse(&p).unwrap();
        let a = v.get("a").unwrap().items().unwrap();
        assert_eq!(a[0].as_int(), Some(1));
        assert_eq!(a[1].as_int(), Some(-2));
        assert!(matches!(a[2], Value::Float(f) if f == 3.5));
        assert_eq!(v.get("b").unwrap().as_str(), Some("xxx"));
        assert_eq!(v.get("c").unwrap().as_int(), Some(1 << 40));
    }

    #[test]
    fn refuses_code_and_bounds_hostile_input() {
        // cos\nsystem\n (GLOBAL): refused.
        assert!(parse(b"\x80\x02cos\nsystem\n.").unwrap_err().contains("would import or call code"));
        // STACK_GLOBAL and REDUCE.
        assert!(parse(b"\x80\x04\x93.").unwrap_err().contains("would import or call code"));
        // A string claiming 2^60 bytes.
        let mut huge = vec![0x80, 4, 0x8d];
        huge.extend((1u64 << 60).to_le_bytes());
        assert!(parse(&huge).unwrap_err().contains("truncated"));
        // 100 nested lists.
        let mut deep = vec![0x80, 4];
        deep.extend(std::iter::repeat_n(b']', 100));
        deep.extend(std::iter::repeat_n(b'a', 99));
        deep.push(b'.');
        assert!(parse(&deep).unwrap_err().contains("nested deeper"));
        assert!(parse(b"").unwrap_err().contains("truncated"));
        assert!(parse(b"\x80\x04h\x05.").unwrap_err().contains("memo entry 5"));
    }
}
