fn main() {
    println!("softrdma: under construction");
}
