// Doubles the 'amount' of each order. Run with JSON in and out:
//   --custom-serde-inputs '{"orders": "json"}' --output-serde-classname json
function process(order, context) {
  return Object.assign({}, order, { amount: order.amount * 2, doubledBy: context.getFunctionName() });
}
